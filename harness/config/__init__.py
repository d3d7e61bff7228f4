"""From the command line to a validated run spec, before any process starts.

registry  where conf/ is, and the strategy class each conf/strategy/<name>.yaml names
schema    the structured-config schema Hydra checks while composing
choices   unknown config-group options, refused before Hydra composes
spec      the validated run spec (every semantic check, one line per refusal)
"""
