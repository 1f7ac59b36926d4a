"""OpenTelemetry traces of model requests (`--otlp-traces-endpoint URL`): see plugins/otel/plugin.py."""
