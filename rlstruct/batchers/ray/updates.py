"""The updates a ``RayBatcher`` owes each actor: every ``update`` becomes one op ``(kind,
version, object ref)`` put once in Ray's object store, queued for every actor and handed to it
with its next call, oldest first.

Nothing here imports Ray (the refs are opaque).
"""

from __future__ import annotations

from rlstruct.batchers.ray.actor import Op

__all__ = ["UpdateLog"]


class UpdateLog:
    """The ops each of ``n`` actors has not received yet, and the newest of each kind (what a
    replacement actor catches up with).

    Args:
        n: the number of actors.
    """

    def __init__(self, n: int) -> None:
        self.pending: list[list[Op]] = [[] for _ in range(n)]
        self.last_weights: Op | None = None
        self.last_info: Op | None = None

    def drop_superseded_weights(self) -> None:
        """Forgets the queued state_dicts that a newer one is about to supersede (so that Ray
        can reuse their memory before the new one is put)."""
        for pending in self.pending:
            while pending and pending[-1][0] == "weights":
                pending.pop()

    def add(self, op: Op) -> None:
        """Queues ``op`` for every actor."""
        for pending in self.pending:
            pending.append(op)
        if op[0] == "weights":
            self.last_weights = op
        else:
            self.last_info = op

    def take(self, w: int) -> list[Op]:
        """The ops actor ``w`` has not received yet; a state_dict followed by a newer one (with
        nothing in between) is skipped, as the ``Batcher``'s ring skips it."""
        ops, self.pending[w] = self.pending[w], []
        return [
            op
            for i, op in enumerate(ops)
            if not (op[0] == "weights" and i + 1 < len(ops) and ops[i + 1][0] == "weights")
        ]

    def catch_up(self, w: int) -> list[Op]:
        """What a replacement of actor ``w`` loads before it collects: the newest weights, and
        the newest non-tensor update when it came after them; nothing else is owed to it."""
        self.pending[w] = []
        ops = [op for op in (self.last_weights, self.last_info) if op is not None]
        ops.sort(key=lambda op: op[1])
        if len(ops) == 2 and ops[0][0] == "info":
            ops = ops[1:]  # the weights came later: the info update is older than them
        return ops
