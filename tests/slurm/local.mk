# The sbatch templates (slurm/) on a real single-host Slurm cluster that the
# test starts and stops itself; skipped (77) unless root with slurm-wlm and
# munge installed. About a minute; see tests/slurm/templates.sh.
SLURM_TESTS = tests/slurm/templates.sh
TESTS += $(SLURM_TESTS)
EXTRA_DIST += $(SLURM_TESTS) tests/slurm/cluster.sh
