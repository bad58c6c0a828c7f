# Settings for one host without a fabric: a workstation with its own
# slurmctld, or the throw-away cluster of tests/slurm. Sourced by the colossal
# sbatch templates: point COLOSSAL_ENV at this file. Every value uses
# ${VAR:-default}, so one job can still override it.

# Every rank is on this host: shared memory between ranks, loopback TCP as
# the fallback (tests/slurm runs several slurmd on one host, and there the
# ranks of different "nodes" must use self,tcp).
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}
# ...on the loopback interface only: left to choose, the TCP transport also
# dials the host's own external address, and a connect there that does not
# complete at once can crash Open MPI at startup.
export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-lo}

# Containers often forbid the cross-memory attach vader uses for large
# messages; plain copies through the shared segment always work.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}

# NCCL between GPUs of this host needs no network; its bootstrap uses the
# loopback interface.
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}
