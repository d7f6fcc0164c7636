"""The catalogue's change notice (ADR-0111) on the bus: core NATS, no stream. The gateway that
records a catalogue version publishes its number; every gateway, executor and reconciler
checks for the newest version when one arrives. A notice missed (a service disconnected, a
message dropped) costs nothing but time: every one of them also checks on a timer."""

from __future__ import annotations

from dispo.libs.contracts._streams import Flow

# The body: the new version's number, as decimal text.
CATALOGUE_CHANGED = "catalogue.changed"

FLOWS = (Flow(CATALOGUE_CHANGED, ("gateway",), ("gateway", "executor", "reconciler")),)
