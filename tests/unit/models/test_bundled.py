"""The bundled SmolLM2-135M: first load builds the cache, later loads read it, logits equal the GGUF's.

Slow (~1 min): dequantizes the GGUF twice (once to build a fresh cache, once as the reference).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from sapo.backends import SamplingConfig, TransformersBackend
from sapo.models import BUNDLED_REF, bundled_model_dir, load_model, tokenizer_fingerprint
from sapo.models import bundled as bundled_module
from sapo.models.bundled import bundled_gguf_path

pytestmark = pytest.mark.slow


def test_first_load_builds_a_cache_that_later_loads_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path))
    _, tokenizer = load_model()

    def no_conversion(target: Path) -> None:
        raise AssertionError(f"the bundled model was converted again into {target}")

    monkeypatch.setattr(bundled_module, "_save_bundled_model", no_conversion)
    cached, _ = load_model(BUNDLED_REF)
    assert bundled_model_dir().is_relative_to(tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in bundled_model_dir().iterdir()
    }
    assert "quantization_config" not in (bundled_model_dir() / "config.json").read_text()

    gguf = bundled_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    ids = torch.tensor([tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        torch.testing.assert_close(cached(ids).logits, reference(ids).logits, atol=1e-5, rtol=0)

    _, tiny_tokenizer = load_model("tiny:0")
    assert tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(tiny_tokenizer)


def test_bundled_model_answers_and_stops_at_the_stop_string() -> None:
    backend = TransformersBackend.from_model_ref(BUNDLED_REF, dtype=torch.bfloat16)
    messages = [{"role": "user", "content": "What is 12 + 30? Put the answer in <answer></answer> tags."}]
    text = backend.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str)
    prompt = backend.tokenizer.encode(text + "<answer>", add_special_tokens=False)
    params = SamplingConfig(max_new_tokens=24, num_samples=4, seed=0, stop=("</answer>",))
    [group] = backend.generate([prompt], params)
    assert len(group) == 4
    for sample in group:
        assert len(sample.token_ids) == len(sample.logprobs)
        assert sample.finish_reason in ("stop", "length")
        assert (sample.finish_reason == "stop") == ("</answer>" in sample.text or sample.token_ids[-1] == 2)
    assert any(s.finish_reason == "stop" for s in group)
