"""The pipelines' shared parts: the stages every driver runs, their flags and statistics."""
