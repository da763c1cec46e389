"""Sequence batching (Triton's `sequence_batching`, stateful models); the config section is
engine/config/sequence.py.

    policy.py   `SequencePolicy` (pure): slots, the backlog and its bounds, idle release, which rows batch
    batcher.py  `SequenceBatcher`: drives the policy on the loop; control inputs, implicit state, answers
"""
