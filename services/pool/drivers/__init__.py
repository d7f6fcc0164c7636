"""Drivers create, remove, list, update and trigger crons where they actually run."""

from dispo.pool.drivers.base import MAX_STATE_BYTES, Driver, DriverError, encode_state

__all__ = ["MAX_STATE_BYTES", "Driver", "DriverError", "encode_state"]
