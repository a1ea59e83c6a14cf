"""The offline wing: load rank traces and sidecars, attach, analyze, write Perfetto."""
