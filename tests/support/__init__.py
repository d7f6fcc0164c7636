"""What tests share: per-test databases, waiting on a condition, fake outside parties.

from support import eventually
"""

from support.waiting import NotReached, eventually

__all__ = ["NotReached", "eventually"]
