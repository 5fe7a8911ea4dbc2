"""Logs (structlog) and traces (OpenTelemetry) for every hookbus process."""
