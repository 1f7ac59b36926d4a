"""The live console (`GET /console`) and its feed of bus events (`GET /-/events`): see plugins/console/plugin.py."""
