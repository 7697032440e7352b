"""Settlement: the settled run of messages, and memory that follows the unsettled ones."""

from __future__ import annotations

from replicator.drizzle.sources import Settlement


def test_a_run_settles_only_up_to_the_first_unfinished_transaction() -> None:
    settlement = Settlement()
    for position, transaction in ((1, 7), (2, None), (3, 8), (4, 7)):
        settlement.arrived(position, transaction)
    settlement.finish([8])
    assert settlement.settle() is None and settlement.oldest_unsettled() == 1
    settlement.finish([7])
    assert settlement.settle() == 4 and settlement.oldest_unsettled() is None


def test_a_stream_that_never_drains_holds_only_the_transactions_it_waits_on() -> None:
    settlement = Settlement()
    # Each transaction's two messages interleave with the next one's: the queue never empties.
    settlement.arrived(0, 0)
    for transaction in range(1, 10_000):
        settlement.arrived(2 * transaction - 1, transaction - 1)
        settlement.arrived(2 * transaction, transaction)
        settlement.finish([transaction - 1])
        assert settlement.settle() == 2 * transaction - 1
        assert settlement.transactions_held <= 2
