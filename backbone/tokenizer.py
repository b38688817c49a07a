"""A tokenizer built on this machine: byte-level BPE trained on a built-in corpus.

Nothing is downloaded. The corpus is generated from robot-instruction templates
(deterministic), so the same vocabulary size always yields the same tokenizer.
The multimodal special tokens take the first ids (see ``SpecialTokens``).
"""

from __future__ import annotations

import itertools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from backbone.presets import SpecialTokens

__all__ = ["build_tokenizer", "instruction_corpus"]

_VERBS = ["pick up", "push", "pull", "place", "stack", "lift", "move", "reach", "grasp", "rotate",
          "open", "close", "slide", "put", "insert", "drop", "align", "press", "turn", "hold"]
_OBJECTS = ["the red cube", "the blue cube", "the green block", "the peg", "the sphere", "the ball",
            "the charger", "the drawer", "the mug", "the bowl", "the tool", "the lid", "the target",
            "the yellow cylinder", "the small box", "the handle"]
_PLACES = ["to the goal", "onto the plate", "into the box", "to the left", "to the right",
           "on top of the other cube", "next to the bowl", "upright", "off the table", "forward",
           "back to the start", "into the hole", "towards the robot", "away from the edge"]


def instruction_corpus() -> list[str]:
    lines = [f"{v} {o} {p}" for v, o, p in itertools.product(_VERBS, _OBJECTS, _PLACES)]
    lines += [f"{line.capitalize()}." for line in lines[::7]]
    lines += ["0 1 2 3 4 5 6 7 8 9", "step episode robot arm gripper camera wrist base joint"]
    return lines


def build_tokenizer(vocab_size: int, tokens: SpecialTokens | None = None) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE with at most ``vocab_size`` entries, specials first."""
    tokens = tokens or SpecialTokens()
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SpecialTokens.names()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(instruction_corpus(), trainer=trainer)
    for name, expected in zip(SpecialTokens.names(), (tokens.pad, tokens.bos, tokens.eos, tokens.image,
                                                      tokens.vision_start, tokens.vision_end),
                              strict=True):
        assert tok.token_to_id(name) == expected, (name, tok.token_to_id(name))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
        padding_side="right", truncation_side="right",
        extra_special_tokens={"image_token": "<image>"},
    )
