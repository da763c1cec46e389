"""Triton's trace extension: settings (settings.py) and the OTLP/HTTP JSON exporter of spans (otlp.py)."""
