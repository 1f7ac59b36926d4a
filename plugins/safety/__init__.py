"""Built-in safety filters: a pattern blocklist and PII redaction (emails, phone numbers, card numbers)."""
