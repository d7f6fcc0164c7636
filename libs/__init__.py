"""Shared building blocks of every Dispo service.

Importing any of them first sets gRPC's fork mode: a Dispo process forks only to exec another
program (PostgreSQL, nats-server, openclaw), and gRPC's fork handlers, which exist for children
that go on running gRPC, race with gRPC's own threads between fork and exec — a pool process
saw its ``openclaw`` child die of SIGSEGV before exec. Each service package imports this module
before anything imports ``grpc``; an operator may still set the variable explicitly.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
