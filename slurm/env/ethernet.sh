# Fabric settings for nodes linked by plain Ethernet/TCP (cloud instances
# without RDMA, small labs). Sourced by the colossal sbatch templates: point
# COLOSSAL_ENV at this file. Every value uses ${VAR:-default}, so one job
# can still override it from the submitting shell.

# The interface that joins the nodes (`ip -br addr`). A prefix matches
# eth0, eth1, ...; ^ excludes instead.
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker,virbr}

# There is no InfiniBand: NCCL uses TCP sockets between nodes (NVLink and
# PCIe within a node are unaffected).
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}

# Parallel sockets per connection and threads driving them: more streams
# fill a 100 Gb/s link that one TCP stream cannot.
export NCCL_SOCKET_NTHREADS=${NCCL_SOCKET_NTHREADS:-4}
export NCCL_NSOCKS_PERTHREAD=${NCCL_NSOCKS_PERTHREAD:-4}

# WARN prints only problems; INFO shows the chosen transports at start-up.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# OpenMPI's ob1 layer: shared memory (vader) within a node, TCP between.
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}

# The same interface for MPI's TCP traffic (an address range works too:
# 10.0.0.0/16).
export OMPI_MCA_btl_tcp_if_exclude=${OMPI_MCA_btl_tcp_if_exclude:-lo,docker0,virbr0}
