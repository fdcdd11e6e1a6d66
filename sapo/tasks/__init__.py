"""Verifiable tasks: profiles, per-node question streams, provenance re-derivation, prompts and rewards.

Pure Python over reasoning-gym: no Kafka, no model. Module map:
- `profiles`: TaskSpec / Profile, the built-in `paper` and `easy` profiles, validation of user profiles.
- `records`: QuestionRecord / Provenance, plain mirrors of the wire Question.
- `seeds`: stable seed derivation and the disjoint train / eval / example seed ranges.
- `datasets`: cached reasoning-gym datasets and item -> record conversion.
- `stream`: TaskStream, a node's reproducible question stream.
- `verify`: rederive / verify_question, so receivers never trust a sender's answer.
- `prompt`: the one-shot chat prompt pre-filled with "<answer>".
- `reward`: score, the local verifier applied to a completion.
"""

from sapo.tasks.datasets import GENERATOR_VERSION
from sapo.tasks.profiles import (
    EASY_PROFILE,
    PAPER_PROFILE,
    PROFILES,
    Profile,
    ProfileError,
    TaskSpec,
    config_digests,
    get_profile,
    load_profile,
    profile_from_dict,
    validate_profile,
)
from sapo.tasks.prompt import (
    ANSWER_PREFILL,
    STOP_STRINGS,
    SYSTEM_PROMPT,
    build_messages,
    encode_prompt,
    prompt_ids,
    render_prompt,
)
from sapo.tasks.records import Provenance, QuestionRecord, Split
from sapo.tasks.reward import score
from sapo.tasks.stream import MAX_POSITION, TaskStream, UnscorableTaskError
from sapo.tasks.verify import REJECTION_REASONS, RederivationError, rederive, verify_question

__all__ = [
    "ANSWER_PREFILL",
    "EASY_PROFILE",
    "GENERATOR_VERSION",
    "MAX_POSITION",
    "PAPER_PROFILE",
    "PROFILES",
    "REJECTION_REASONS",
    "STOP_STRINGS",
    "SYSTEM_PROMPT",
    "Profile",
    "ProfileError",
    "Provenance",
    "QuestionRecord",
    "RederivationError",
    "Split",
    "TaskSpec",
    "TaskStream",
    "UnscorableTaskError",
    "build_messages",
    "config_digests",
    "encode_prompt",
    "get_profile",
    "load_profile",
    "profile_from_dict",
    "prompt_ids",
    "rederive",
    "render_prompt",
    "score",
    "validate_profile",
    "verify_question",
]
