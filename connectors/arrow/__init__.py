"""The Arrow fast path's codecs: JSON lines and CSV decoded, and JSON lines encoded, by Arrow
exactly where the result is certainly Spark's (anything else is refused, and Spark does it)."""
