"""A tiny randomly initialised Llama and a word-level tokenizer, built locally (no downloads)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = 32
PAD_ID = WORDS
EOS_ID = WORDS + 1
VOCAB_SIZE = WORDS + 3


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """~20k parameters; rotary positions, so a shifted position changes the log-probs."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # The default init (std 0.02) gives near-uniform outputs; larger weights make the log-probs
    # depend visibly on the context and on the positions.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.5)
    model.train(False)  # eval mode: no dropout
    return model


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"w{i}": i for i in range(WORDS)}
    vocab |= {"<pad>": PAD_ID, "<eos>": EOS_ID, "<unk>": EOS_ID + 1}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
