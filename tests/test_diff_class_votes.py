"""The class map's choice among tied votes depends on the votes, never on their order.

The differ maps a recovered class to the base class most of its matched methods belong to. The
matched pairs come in the order of the code objects' addresses, which differ between two images
of the same program: a class with two methods matched into two base classes (transformers'
Qwen2ForCausalLM: its `__init__` into LlamaForCausalLM, a shared helper into LlamaAttention) must
get the same base class whichever image it came from."""

from __future__ import annotations

import itertools
from collections import Counter

from zen.diff.differ import _elected

REC = "transformers.models.qwen2.modeling_qwen2.Qwen2ForCausalLM"
CAUSAL = "transformers.models.llama.modeling_llama.LlamaForCausalLM"
ATTN = "transformers.models.llama.modeling_llama.LlamaAttention"


def _votes(order, scores):
    votes, weight = Counter(), Counter()
    for b in order:
        votes[b] += 1
        weight[b] += scores[b]
    return votes, weight


def test_tied_counts_go_to_the_closer_name_in_any_order():
    scores = {CAUSAL: 0.91, ATTN: 1.0}  # the exact match is a helper shared by many classes
    for order in itertools.permutations([CAUSAL, ATTN]):
        assert _elected(REC, *_votes(order, scores)) == CAUSAL


def test_tied_counts_and_names_go_to_the_higher_score_in_any_order():
    a, b = "fork.blocks.Alpha", "fork.blocks.Gamma"  # equally far from "Zq12" (a renamed class)
    for order in itertools.permutations([a, b]):
        assert _elected("fork.Zq12", *_votes(order, {a: 0.8, b: 0.95})) == b


def test_more_votes_win_over_a_closer_name():
    votes, weight = _votes([ATTN, ATTN, CAUSAL], {CAUSAL: 1.0, ATTN: 0.7})
    assert _elected(REC, votes, weight) == ATTN
