"""What each rank writes when a stall, an exception or a signal asks for a dump, and how the
ranks are asked and their dumps gathered. Folder layout: ``docs/dump-format.md``."""
