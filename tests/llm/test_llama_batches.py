"""llama.cpp's slot and ubatch rule (agentflow.llm.llama_batches): which slot a request gets,
and how a batch splits into forward passes with one KV stream per slot."""

from __future__ import annotations

import pytest

from agentflow.llm.llama_batches import Piece, SlotTable, batch_order, decode_groups, ubatches


def test_slots_go_to_the_idle_slot_released_longest_ago():
    t = SlotTable(4)
    assert [t.take(x) for x in "abcd"] == [3, 2, 1, 0]  # never used: the last one first
    t.release("c", 5.0)
    t.release("a", 7.0)
    assert t.take("e") == 1
    t.release("d", 8.0)
    t.release("b", 2.0)
    assert t.take("f") == 2 and t.take("g") == 3 and t.take("h") == 0
    with pytest.raises(RuntimeError, match="no idle slot"):
        t.take("i")


def test_a_ubatch_holds_only_consecutive_slots_and_equal_token_counts():
    dec = [Piece(0, 1, 100, True, True), Piece(1, 1, 50, True, True)]
    assert [[p.slot for p in u] for u in ubatches(dec, 512)] == [[0, 1]]
    apart = [Piece(0, 1, 100, True, True), Piece(2, 1, 50, True, True)]
    assert [[p.slot for p in u] for u in ubatches(apart, 512)] == [[0], [2]]
    # decode in slot 1, prompts in slots 0 (600 tokens) and 2 (300): the server's batch is
    # [1, 0 x 600, 2 x 300]; slot 2 follows 1, so it joins the first ubatch with one token
    mixed = batch_order([Piece(0, 600, 0, False, True), Piece(2, 300, 0, False, False),
                         Piece(1, 1, 80, True, True)])
    got = [[(p.slot, p.n, p.context, p.samples) for p in u] for u in ubatches(mixed, 512)]
    assert got == [[(1, 1, 80, True), (2, 1, 0, False)], [(0, 512, 0, False)],
                   [(0, 88, 512, True)], [(2, 299, 1, False)]]
    assert decode_groups([3, 0, 1, 5]) == [[1, 2], [0], [3]]
