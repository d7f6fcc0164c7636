"""Schedules: submissions the gateway makes on a cron expression or an interval (ADR-0104)."""
