{{/*
Names and labels. Kubernetes names are capped at 63 characters.
*/}}
{{- define "sapo-node.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sapo-node.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of one service's resources: <fullname>-<service>, the service suffix always kept. */}}
{{- define "sapo-node.componentName" -}}
{{- printf "%s-%s" (include "sapo-node.fullname" .root | trunc 52 | trimSuffix "-") .component }}
{{- end }}

{{- define "sapo-node.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every resource. The chart version appears only in helm.sh/chart, which is never part of
a selector (selectors are immutable, so a chart upgrade would otherwise fail).
*/}}
{{- define "sapo-node.labels" -}}
helm.sh/chart: {{ include "sapo-node.chart" . }}
{{ include "sapo-node.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sapo-swarm
sapo-swarm.io/node-id: {{ .Values.nodeId | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "sapo-node.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sapo-node.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end }}

{{/* Labels of one service's resources; call with (dict "root" $ "component" "generator"). */}}
{{- define "sapo-node.componentLabels" -}}
{{ include "sapo-node.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "sapo-node.componentSelectorLabels" -}}
{{ include "sapo-node.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The services this release runs (<service>.enabled), in the order generator, sampler, trainer: a
JSON list, read with fromJsonArray. */}}
{{- define "sapo-node.services" -}}
{{- $on := list }}
{{- range $component := list "generator" "sampler" "trainer" }}
{{- if (index $.Values $component).enabled }}
{{- $on = append $on $component }}
{{- end }}
{{- end }}
{{- $on | toJson }}
{{- end }}

{{- define "sapo-node.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sapo-node.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sapo-node.checkpointClaim" -}}
{{- default (printf "%s-checkpoints" (include "sapo-node.fullname" .)) .Values.checkpoints.existingClaim }}
{{- end }}

{{/* Topic names, as sapo.topics.TopicNames.for_node builds them. */}}
{{- define "sapo-node.nodeTopic" -}}
{{- printf "%s.node.%s.%s" .root.Values.topicPrefix .root.Values.nodeId .kind }}
{{- end }}

{{/* True (non-empty) when this service runs on a GPU: generator.gpu or trainer.gpu. */}}
{{- define "sapo-node.gpu" -}}
{{- $svc := index .root.Values .component }}
{{- if and (hasKey $svc "gpu") $svc.gpu.enabled }}true{{ end }}
{{- end }}

{{/*
Image of one service: the service's own override, else gpuImage (GPU generator or trainer) or image;
global.imageRegistry wins over every registry. <registry>/<repository>@<digest> when a digest is set,
else <registry>/<repository>:<tag>. Call with (dict "root" $ "component" "generator").
*/}}
{{- define "sapo-node.image" -}}
{{- $svc := index .root.Values .component }}
{{- $base := ternary .root.Values.gpuImage .root.Values.image (eq (include "sapo-node.gpu" .) "true") }}
{{- $global := default dict .root.Values.global }}
{{- $registry := default (default $base.registry $svc.image.registry) $global.imageRegistry }}
{{- $repo := default $base.repository $svc.image.repository }}
{{- $name := ternary (printf "%s/%s" $registry $repo) $repo (ne $registry "") }}
{{- $digest := default $base.digest $svc.image.digest }}
{{- if $digest }}
{{- printf "%s@%s" $name $digest }}
{{- else }}
{{- printf "%s:%s" $name (default (default .root.Chart.AppVersion $base.tag) $svc.image.tag) }}
{{- end }}
{{- end }}

{{- define "sapo-node.imagePullPolicy" -}}
{{- $svc := index .root.Values .component }}
{{- $base := ternary .root.Values.gpuImage .root.Values.image (eq (include "sapo-node.gpu" .) "true") }}
{{- default $base.pullPolicy $svc.image.pullPolicy }}
{{- end }}

{{/*
Env of one Kafka connection (sapo.settings.KafkaConnection) under <prefix><field>__.
Call with (dict "prefix" "SAPO_SAMPLER_" "field" "KAFKA" "conn" .Values.kafka "caPath" "/path" "client" "id").
Secrets come from existing Secrets only (secretKeyRef), never from values.
*/}}
{{- define "sapo-node.kafkaEnv" -}}
{{- $p := printf "%s%s__" .prefix .field }}
- name: {{ $p }}BOOTSTRAP_SERVERS
  value: {{ required (printf "%s bootstrapServers is required" .field) .conn.bootstrapServers | quote }}
- name: {{ $p }}SECURITY_PROTOCOL
  value: {{ .conn.securityProtocol | quote }}
- name: {{ $p }}CLIENT_ID
  value: {{ .client | quote }}
{{- if .conn.sasl.mechanism }}
- name: {{ $p }}SASL_MECHANISM
  value: {{ .conn.sasl.mechanism | quote }}
{{- end }}
{{- if .conn.sasl.username }}
- name: {{ $p }}SASL_USERNAME
  value: {{ .conn.sasl.username | quote }}
{{- end }}
{{- if .conn.sasl.passwordSecret.name }}
- name: {{ $p }}SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .conn.sasl.passwordSecret.name }}
      key: {{ .conn.sasl.passwordSecret.key }}
{{- end }}
{{- if .conn.caSecret.name }}
- name: {{ $p }}SSL_CA_LOCATION
  value: {{ printf "%s/%s" .caPath .conn.caSecret.key | quote }}
{{- end }}
{{- if .conn.clientCertSecret.name }}
- name: {{ $p }}SSL_CERTIFICATE_LOCATION
  value: {{ printf "%s/%s" .certPath .conn.clientCertSecret.certKey | quote }}
- name: {{ $p }}SSL_KEY_LOCATION
  value: {{ printf "%s/%s" .certPath .conn.clientCertSecret.keyKey | quote }}
{{- end }}
{{- end }}

{{/*
One entry of a bootstrapServers list that the services take (sapo.cliargs.broker_addresses) or
stricter: [SCHEME://]host:port with the port named, 1-65535 without a leading zero; a host name of
labels of at most 63 characters (at most 253 in all: sapo-node.validateBrokers checks that), or an
IPv6 address in brackets (RFC 3986's forms).
Here rather than as a schema pattern, whose refusal would print the whole expression.
*/}}
{{- define "sapo-node.brokerPattern" -}}
{{- $h16 := `[0-9A-Fa-f]{1,4}` }}
{{- $octet := `(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])` }}
{{- $ls32 := printf `(%s:%s|%s(\.%s){3})` $h16 $h16 $octet $octet }}
{{- $ipv6 := list
  (printf `(%s:){6}%s` $h16 $ls32)
  (printf `::(%s:){5}%s` $h16 $ls32)
  (printf `(%s)?::(%s:){4}%s` $h16 $h16 $ls32)
  (printf `((%s:){0,1}%s)?::(%s:){3}%s` $h16 $h16 $h16 $ls32)
  (printf `((%s:){0,2}%s)?::(%s:){2}%s` $h16 $h16 $h16 $ls32)
  (printf `((%s:){0,3}%s)?::%s:%s` $h16 $h16 $h16 $ls32)
  (printf `((%s:){0,4}%s)?::%s` $h16 $h16 $ls32)
  (printf `((%s:){0,5}%s)?::%s` $h16 $h16 $h16)
  (printf `((%s:){0,6}%s)?::` $h16 $h16) }}
{{- $host := `[A-Za-z0-9_-]{1,63}(\.[A-Za-z0-9_-]{1,63})*\.?` }}
{{- $port := `(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})` }}
{{- printf `^((PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL)://)?(%s|\[(%s)\]):%s$` $host (join "|" $ipv6) $port }}
{{- end }}

{{/* Refuses a bootstrapServers list of a form the services refuse, naming the entry at fault and the
form expected; an empty list is left to `required`. Call with (dict "name" "kafka" "conn" .Values.kafka). */}}
{{- define "sapo-node.validateBrokers" -}}
{{- $ctx := . }}
{{- $address := include "sapo-node.brokerPattern" . }}
{{- with .conn.bootstrapServers }}
{{- /* As the services read the list: each entry trimmed, empty ones (a trailing comma) skipped. */}}
{{- $brokers := list }}
{{- range $item := splitList "," . }}
{{- with trim $item }}
{{- $brokers = append $brokers . }}
{{- end }}
{{- end }}
{{- if not $brokers }}
{{- fail (printf "%s.bootstrapServers=%q names no broker; expected host:port[,host:port...]" $ctx.name $ctx.conn.bootstrapServers) }}
{{- end }}
{{- range $broker := $brokers }}
{{- if not (regexMatch $address $broker) }}
{{- fail (printf "%s.bootstrapServers=%q: %q is not a broker address; expected host:port[,host:port...] (port 1-65535, an IPv6 host in brackets as [::1]:9092, optionally the securityProtocol's scheme first as SASL_SSL://host:port)" $ctx.name $ctx.conn.bootstrapServers $broker) }}
{{- end }}
{{- /* The services also refuse a host name longer than 253 characters (a trailing dot counted),
which a pattern of labels cannot bound. */}}
{{- $host := regexReplaceAll "^([A-Z_]+://)?(.*):[0-9]+$" $broker "${2}" }}
{{- if gt (len $host) 253 }}
{{- fail (printf "%s.bootstrapServers=%q: %q is not a broker address; its host name has %d characters, at most 253 are allowed" $ctx.name $ctx.conn.bootstrapServers $broker (len $host)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Fail early, with what to set, on combinations the schema cannot express. Mirrors the checks in
sapo.settings.KafkaConnection so a bad release fails at `helm install`, not in a crash loop.
*/}}
{{- define "sapo-node.validateKafka" -}}
{{- $sasl := has .conn.securityProtocol (list "SASL_PLAINTEXT" "SASL_SSL") }}
{{- if and $sasl (not .conn.sasl.mechanism) }}
{{- fail (printf "%s.securityProtocol=%s needs %s.sasl.mechanism" .name .conn.securityProtocol .name) }}
{{- end }}
{{- if and (not $sasl) (or .conn.sasl.mechanism .conn.sasl.username .conn.sasl.passwordSecret.name) }}
{{- fail (printf "%s.sasl is set but %s.securityProtocol=%s does not use SASL, so the services would connect without it; use SASL_SSL or SASL_PLAINTEXT" .name .name .conn.securityProtocol) }}
{{- end }}
{{- if and (has .conn.sasl.mechanism (list "PLAIN" "SCRAM-SHA-256" "SCRAM-SHA-512")) (not (and .conn.sasl.username .conn.sasl.passwordSecret.name)) }}
{{- fail (printf "%s.sasl.mechanism=%s needs %s.sasl.username and %s.sasl.passwordSecret.name (an existing Secret)" .name .conn.sasl.mechanism .name .name) }}
{{- end }}
{{- $ctx := . }}
{{- range $broker := splitList "," (default "" .conn.bootstrapServers) }}
{{- $scheme := regexFind "^[A-Za-z_]+://" (trim $broker) | trimSuffix "://" | upper }}
{{- if and $scheme (ne $scheme $ctx.conn.securityProtocol) }}
{{- fail (printf "%s.bootstrapServers names the scheme %s:// but %s.securityProtocol=%s: the Kafka client drops such a broker and the services refuse it; set %s.securityProtocol=%s, or leave the scheme out" $ctx.name $scheme $ctx.name $ctx.conn.securityProtocol $ctx.name $scheme) }}
{{- end }}
{{- end }}
{{- if and .conn.caSecret.name (not (has .conn.securityProtocol (list "SSL" "SASL_SSL"))) }}
{{- fail (printf "%s.caSecret is set but %s.securityProtocol=%s does not use TLS; use SSL or SASL_SSL" .name .name .conn.securityProtocol) }}
{{- end }}
{{- if and .conn.clientCertSecret.name (not (has .conn.securityProtocol (list "SSL" "SASL_SSL"))) }}
{{- fail (printf "%s.clientCertSecret is set but %s.securityProtocol=%s does not use TLS; use SSL (mutual TLS)" .name .name .conn.securityProtocol) }}
{{- end }}
{{- end }}

{{/*
Env shared by every service, then the service's settings map and raw extraEnv.
Call with (dict "root" $ "component" "sampler").
*/}}
{{- define "sapo-node.env" -}}
{{- $v := .root.Values }}
{{- $svc := index $v .component }}
{{- $prefix := printf "SAPO_%s_" (upper .component) }}
{{- $client := printf "sapo-%s-%s" $v.nodeId .component }}
- name: {{ $prefix }}NODE_ID
  value: {{ $v.nodeId | quote }}
- name: {{ $prefix }}TOPIC_PREFIX
  value: {{ $v.topicPrefix | quote }}
- name: {{ $prefix }}HTTP_PORT
  value: {{ $v.httpPort | quote }}
- name: {{ $prefix }}LOG_FORMAT
  value: {{ $v.logFormat | quote }}
- name: {{ $prefix }}LOG_LEVEL
  value: {{ $v.logLevel | quote }}
- name: {{ $prefix }}MAX_MESSAGE_BYTES
  value: {{ $v.maxMessageBytes | int64 | toString | quote }}
{{ include "sapo-node.kafkaEnv" (dict "prefix" $prefix "field" "KAFKA" "conn" $v.kafka "caPath" "/etc/sapo/kafka-ca" "certPath" "/etc/sapo/kafka-client" "client" $client) | trim }}
{{- if $v.swarmKafka.enabled }}
{{ include "sapo-node.kafkaEnv" (dict "prefix" $prefix "field" "SWARM_KAFKA" "conn" $v.swarmKafka "caPath" "/etc/sapo/swarm-kafka-ca" "certPath" "/etc/sapo/swarm-kafka-client" "client" $client) | trim }}
{{- end }}
{{ include "sapo-node.identityEnv" (dict "identity" $v.identity "prefix" $prefix "component" .component) }}
{{- if and $v.model (ne .component "sampler") }}
{{- if hasKey $svc.settings "MODEL" }}
{{- fail (printf "set the model once: model=%s and %s.settings.MODEL are both set" $v.model .component) }}
{{- end }}
- name: {{ $prefix }}MODEL
  value: {{ $v.model | quote }}
{{- end }}
{{- if eq .component "trainer" }}
- name: {{ $prefix }}CHECKPOINT_ROOT
  value: {{ default $v.checkpoints.mountPath $v.checkpoints.url | quote }}
{{- end }}
{{- if and (ne .component "sampler") $v.checkpoints.url }}
{{- with $v.checkpoints.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with $v.checkpoints.region }}
- name: AWS_DEFAULT_REGION
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- if and (eq .component "generator") $v.generator.gpu.enabled (not (hasKey $svc.settings "BACKEND")) }}
- name: {{ $prefix }}BACKEND
  value: "vllm"
{{- end }}
{{- if and (eq .component "trainer") $v.trainer.gpu.enabled (not (hasKey $svc.settings "DEVICE")) }}
- name: {{ $prefix }}DEVICE
  value: "cuda"
{{- end }}
{{- /* Caches on the writable cache volume (the root filesystem is read-only). */}}
- name: XDG_CACHE_HOME
  value: {{ $v.cache.mountPath | quote }}
- name: SAPO_CACHE_DIR
  value: {{ printf "%s/sapo-swarm" $v.cache.mountPath | quote }}
- name: HF_HOME
  value: {{ printf "%s/huggingface" $v.cache.mountPath | quote }}
- name: TRITON_CACHE_DIR
  value: {{ printf "%s/triton" $v.cache.mountPath | quote }}
- name: MPLCONFIGDIR
  value: {{ printf "%s/matplotlib" $v.cache.mountPath | quote }}
- name: VLLM_CACHE_ROOT
  value: {{ printf "%s/vllm" $v.cache.mountPath | quote }}
{{- if and (ne .component "sampler") (or $v.models.download.enabled $v.models.volume) }}
- name: HF_HUB_OFFLINE
  value: "1"
{{- end }}
{{- range $key, $value := $svc.settings }}
{{- /* YAML numbers arrive as float64: print whole ones as integers, not 6e+07. */}}
{{- $text := toString $value }}
{{- if and (kindIs "float64" $value) (eq (float64 (int64 $value)) $value) }}
{{- $text = int64 $value | toString }}
{{- end }}
- name: {{ $prefix }}{{ $key }}
  value: {{ $text | quote }}
{{- end }}
{{- with $svc.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Secret volumes of the Kafka connections: CA bundles and mTLS client certificates. */}}
{{- define "sapo-node.kafkaSecretVolumes" -}}
{{- range $conn := include "sapo-node.kafkaConnections" . | fromYamlArray }}
{{- $c := index $.Values $conn.field }}
{{- if $c.caSecret.name }}
- name: {{ $conn.volume }}-ca
  secret:
    secretName: {{ $c.caSecret.name }}
    items:
      - key: {{ $c.caSecret.key }}
        path: {{ $c.caSecret.key }}
{{- end }}
{{- if $c.clientCertSecret.name }}
- name: {{ $conn.volume }}-client
  secret:
    secretName: {{ $c.clientCertSecret.name }}
    # The key is read by uid 10001 only (fsGroup): 0440.
    defaultMode: 288
    items:
      - key: {{ $c.clientCertSecret.certKey }}
        path: {{ $c.clientCertSecret.certKey }}
      - key: {{ $c.clientCertSecret.keyKey }}
        path: {{ $c.clientCertSecret.keyKey }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sapo-node.kafkaSecretMounts" -}}
{{- range $conn := include "sapo-node.kafkaConnections" . | fromYamlArray }}
{{- $c := index $.Values $conn.field }}
{{- if $c.caSecret.name }}
- name: {{ $conn.volume }}-ca
  mountPath: /etc/sapo/{{ $conn.volume }}-ca
  readOnly: true
{{- end }}
{{- if $c.clientCertSecret.name }}
- name: {{ $conn.volume }}-client
  mountPath: /etc/sapo/{{ $conn.volume }}-client
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{/* The Kafka connections in use: the node's own, and the swarm's when swarmKafka.enabled. */}}
{{- define "sapo-node.kafkaConnections" -}}
- {field: kafka, volume: kafka}
{{- if .Values.swarmKafka.enabled }}
- {field: swarmKafka, volume: swarm-kafka}
{{- end }}
{{- end }}

{{/*
Every Secret one service's pod reads, sorted: for the checksum and reloader annotations.
Call with (dict "root" $ "component" "generator").
*/}}
{{- define "sapo-node.secretNames" -}}
{{- $v := .root.Values }}
{{- $names := list }}
{{- range $conn := include "sapo-node.kafkaConnections" .root | fromYamlArray }}
{{- $c := index $v $conn.field }}
{{- $names = concat $names (compact (list $c.sasl.passwordSecret.name $c.caSecret.name $c.clientCertSecret.name)) }}
{{- end }}
{{- if and (ne .component "sampler") $v.checkpoints.existingSecret }}
{{- $names = append $names $v.checkpoints.existingSecret }}
{{- end }}
{{- if and (eq .component "generator") $v.identity.keySecret.name }}
{{- $names = append $names $v.identity.keySecret.name }}
{{- end }}
{{- if and (ne .component "sampler") $v.models.download.enabled $v.models.download.tokenSecret.name }}
{{- $names = append $names $v.models.download.tokenSecret.name }}
{{- end }}
{{- range $entry := (index $v .component).extraEnv }}
{{- if and $entry.valueFrom $entry.valueFrom.secretKeyRef }}
{{- $names = append $names $entry.valueFrom.secretKeyRef.name }}
{{- end }}
{{- end }}
{{- $names | uniq | sortAlpha | toJson }}
{{- end }}

{{/*
checksum/secrets: the referenced Secrets' names and, where Helm can read them (install, upgrade;
not `helm template`), their resourceVersions, so `helm upgrade` after a rotation rolls the pods.
*/}}
{{- define "sapo-node.secretsChecksum" -}}
{{- $parts := list }}
{{- range $name := include "sapo-node.secretNames" . | fromJsonArray }}
{{- $secret := lookup "v1" "Secret" $.root.Release.Namespace $name }}
{{- $version := "" }}
{{- if $secret }}
{{- $version = $secret.metadata.resourceVersion }}
{{- end }}
{{- $parts = append $parts (printf "%s=%s" $name $version) }}
{{- end }}
{{- join "," $parts | sha256sum }}
{{- end }}

{{/*
API version of Strimzi's KafkaTopic and KafkaUser: strimzi.apiVersion, else the newest the cluster
serves, else kafka.strimzi.io/v1 (Strimzi >= 0.49; 1.0 serves only v1).
*/}}
{{- define "sapo-node.strimziApiVersion" -}}
{{- if .Values.strimzi.apiVersion }}
{{- .Values.strimzi.apiVersion }}
{{- else if .Capabilities.APIVersions.Has "kafka.strimzi.io/v1/KafkaTopic" }}
{{- "kafka.strimzi.io/v1" }}
{{- else if .Capabilities.APIVersions.Has "kafka.strimzi.io/v1beta2/KafkaTopic" }}
{{- "kafka.strimzi.io/v1beta2" }}
{{- else }}
{{- "kafka.strimzi.io/v1" }}
{{- end }}
{{- end }}

{{/* The topic prefix as a piece of a Kubernetes name: lower case, '_' and '.' as '-', no '-' at either
end. Call with the prefix. */}}
{{- define "sapo-node.prefixSlug" -}}
{{- . | lower | replace "_" "-" | replace "." "-" | trimAll "-" }}
{{- end }}

{{/* The name of a swarm KafkaTopic object (suffix "rollouts" or "keys"), shared by every node of the
swarm: the form earlier charts gave it while that form is a valid name distinct from its sibling's,
so an upgrade keeps its objects; otherwise the prefix lower case, '_' as '-', each '.' with the '-' and
'.' around it as one '.', no '-' or '.' at either end. Call with (dict "root" $ "suffix" "rollouts"). */}}
{{- define "sapo-node.swarmTopicObject" -}}
{{- $prefix := .root.Values.topicPrefix | lower | replace "_" "-" }}
{{- $legacy := $prefix | trimAll "-" | trimAll "." }}
{{- $old := dict }}
{{- range list "rollouts" "keys" }}
{{- $_ := set $old . (printf "%s-swarm-%s" $legacy . | trunc 63 | trimSuffix "-") }}
{{- end }}
{{- $name := get $old .suffix }}
{{- $label := "[a-z0-9]([-a-z0-9]*[a-z0-9])?" }}
{{- if not (and (regexMatch (printf "^%s(\\.%s)*$" $label $label) $name) (ne $old.rollouts $old.keys)) }}
{{- $slug := regexReplaceAll "[-.]*\\.[-.]*" $prefix "." }}
{{- $slug = regexReplaceAll "^[-.]+|[-.]+$" $slug "" }}
{{- $name = printf "%s-swarm-%s" $slug .suffix | trimPrefix "-" }}
{{- end }}
{{- $name }}
{{- end }}

{{/* `sapo-node.prefixSlug`; a prefix that had to change gets a digest of itself, so
prefixes that differ in those characters only (sapo.a, sapo_a, Sapo-a) stay apart. */}}
{{- define "sapo-node.prefixName" -}}
{{- $prefix := .Values.topicPrefix }}
{{- $name := include "sapo-node.prefixSlug" $prefix }}
{{- if ne $name $prefix }}
{{- $name = printf "%s-%s" $name (sha256sum $prefix | trunc 6) | trimPrefix "-" }}
{{- end }}
{{- $name }}
{{- end }}

{{/* The Kubernetes name of an object that lives outside the release's namespace (the node's KafkaTopics
in the Strimzi namespace, its dashboard in Grafana's): named by topic prefix and node id, which are
unique among the swarms of one cluster, not by release, which two nodes in two namespaces may share.
Call with (dict "root" $ "suffix" "rollouts"). */}}
{{- define "sapo-node.sharedName" -}}
{{- printf "%s-node-%s-%s" (include "sapo-node.prefixName" .root) .root.Values.nodeId .suffix }}
{{- end }}

{{/* Name of the node's KafkaUser (also its Secret's name, and its TLS certificate's CN: no digest, so
that the name stays what earlier charts made it). */}}
{{- define "sapo-node.kafkaUserName" -}}
{{- $slug := include "sapo-node.prefixSlug" .Values.topicPrefix }}
{{- default (printf "%s-%s" $slug .Values.nodeId) .Values.kafkaUser.name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* True (non-empty) when the checkpoint claim can be mounted from several Kubernetes nodes. */}}
{{- define "sapo-node.checkpointsShared" -}}
{{- if has "ReadWriteMany" .Values.checkpoints.accessModes }}true{{ end }}
{{- end }}

{{/* Refuses an identity mode whose files are missing, and settings that mode would not use. */}}
{{- define "sapo-node.validateIdentity" -}}
{{- $id := .Values.identity }}
{{- if and (ne $id.mode "off") (not $id.keySecret.name) }}
{{- fail (printf "identity.mode=%s: a verifying node must sign; set identity.keySecret.name (sapo keys generate)" $id.mode) }}
{{- end }}
{{- if and $id.keysTopic (eq $id.mode "off") }}
{{- fail "identity.keysTopic=true needs identity.mode strict or tofu: with identity off nothing reads the keys topic" }}
{{- end }}
{{- if and $id.pinsFile (ne $id.mode "tofu") }}
{{- fail (printf "identity.pinsFile is kept by identity.mode=tofu only (mode is %s)" $id.mode) }}
{{- end }}
{{- if $id.pinsFile }}
{{- /* The root filesystem is read-only: the pins go on a volume the sampler can write and keep. */}}
{{- $v := .Values }}
{{- $lasting := list }}
{{- if $v.cache.existingClaim }}
{{- $lasting = append $lasting $v.cache.mountPath }}
{{- end }}
{{- range $v.sampler.extraVolumeMounts }}
{{- if not .readOnly }}
{{- $lasting = append $lasting .mountPath }}
{{- end }}
{{- end }}
{{- $kept := false }}
{{- range $lasting }}
{{- if hasPrefix (printf "%s/" (trimSuffix "/" .)) $id.pinsFile }}
{{- $kept = true }}
{{- end }}
{{- end }}
{{- if not $kept }}
{{- fail (printf "identity.pinsFile=%s is on no volume that outlives the sampler pod: put it under a writable sampler.extraVolumeMounts path (or cache.mountPath with cache.existingClaim)" $id.pinsFile) }}
{{- end }}
{{- end }}
{{- if and (eq $id.mode "strict") (not $id.trustConfigMap.name) }}
{{- fail "identity.mode=strict needs the trust list: set identity.trustConfigMap.name (sapo keys trust)" }}
{{- end }}
{{- end }}

{{/*
Identity env of one service: the generator signs (key file), the sampler verifies (mode, trust list,
keys topic); the trainer shares nothing. `sapo-node.validateIdentity` checked the values.
*/}}
{{- define "sapo-node.identityEnv" -}}
{{- $id := .identity }}
{{- if and (eq .component "generator") $id.keySecret.name }}
- name: {{ .prefix }}IDENTITY__PRIVATE_KEY_FILE
  value: {{ printf "/etc/sapo/identity/key/%s" $id.keySecret.key | quote }}
{{- end }}
{{- if and (eq .component "sampler") (ne $id.mode "off") }}
- name: {{ .prefix }}IDENTITY__MODE
  value: {{ $id.mode | quote }}
{{- if $id.trustConfigMap.name }}
- name: {{ .prefix }}IDENTITY__TRUST_FILE
  value: {{ printf "/etc/sapo/identity/trust/%s" $id.trustConfigMap.key | quote }}
{{- end }}
{{- if $id.keysTopic }}
- name: {{ .prefix }}IDENTITY__KEYS_TOPIC
  value: "true"
{{- end }}
{{- with $id.pinsFile }}
- name: {{ $.prefix }}IDENTITY__PINS_FILE
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The identity files of one service: the key (generator, owner-read-only), the trust list (sampler). */}}
{{- define "sapo-node.identityVolumes" -}}
{{- $id := .root.Values.identity }}
{{- if and (eq .component "generator") $id.keySecret.name }}
- name: identity-key
  secret:
    secretName: {{ $id.keySecret.name }}
    defaultMode: 0400
    items:
      - key: {{ $id.keySecret.key }}
        path: {{ $id.keySecret.key }}
{{- end }}
{{- if and (eq .component "sampler") (ne $id.mode "off") $id.trustConfigMap.name }}
- name: identity-trust
  configMap:
    name: {{ $id.trustConfigMap.name }}
    items:
      - key: {{ $id.trustConfigMap.key }}
        path: {{ $id.trustConfigMap.key }}
{{- end }}
{{- end }}

{{- define "sapo-node.identityMounts" -}}
{{- $id := .root.Values.identity }}
{{- if and (eq .component "generator") $id.keySecret.name }}
- name: identity-key
  mountPath: /etc/sapo/identity/key
  readOnly: true
{{- end }}
{{- if and (eq .component "sampler") (ne $id.mode "off") $id.trustConfigMap.name }}
- name: identity-trust
  mountPath: /etc/sapo/identity/trust
  readOnly: true
{{- end }}
{{- end }}

{{/* NetworkPolicy ports; call with (dict "ports" (list 9092) "protocol" "TCP"). */}}
{{- define "sapo-node.ports" -}}
{{- range $port := .ports }}
- port: {{ $port }}
  protocol: {{ $.protocol }}
{{- end }}
{{- end }}

{{/* Milliseconds of a Prometheus duration such as 30m, 1h30m or 1500ms (units ms, s, m, h, d, w, y). */}}
{{- define "sapo-node.milliseconds" -}}
{{- $ms := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 }}
{{- $total := 0 }}
{{- range $part := regexFindAll "[0-9]+(ms|[smhdwy])" . -1 }}
{{- $unit := regexFind "(ms|[smhdwy])$" $part }}
{{- $total = add $total (mul (trimSuffix $unit $part | int64) (index $ms $unit)) }}
{{- end }}
{{- $total }}
{{- end }}

{{/* Whole seconds of a Prometheus duration. */}}
{{- define "sapo-node.seconds" -}}
{{- div (include "sapo-node.milliseconds" . | int64) 1000 }}
{{- end }}
