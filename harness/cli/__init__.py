"""What the config-driven commands share.

hydra_app  the Hydra entry over conf/, the checks that refuse bad overrides in one line, the
           sweep's jobs, --show
job        one job of ``pipebench run``: validate, launch, record, mirror, summarise
sweep      the callback that names a sweep and ends it with its comparison table
"""
