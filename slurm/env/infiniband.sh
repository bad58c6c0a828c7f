# Fabric settings for an InfiniBand cluster with NVIDIA GPUs (sourced by the
# colossal sbatch templates; the default COLOSSAL_ENV). Edit the values once
# for your site; `ibv_devinfo` lists the HCAs and their ports, `ip -br addr`
# the interfaces. Every value uses ${VAR:-default}, so one job can still
# override it from the submitting shell (VAR=... sbatch ...).

# --- NCCL (GPU collectives) -------------------------------------------------

# HCAs NCCL may use for GPU traffic. A prefix selects every matching device
# (mlx5 = mlx5_0, mlx5_1, ...); list device:port pairs to pick exactly
# (mlx5_0:1,mlx5_1:1), or exclude with ^ (^mlx5_4 for a storage-only HCA).
export NCCL_IB_HCA=${NCCL_IB_HCA:-mlx5}

# Interface for NCCL's bootstrap and its TCP fallback: the cluster network,
# never the loopback, docker or libvirt bridges. A prefix, or ^ to exclude.
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker,virbr}

# InfiniBand on (NCCL's default; 1 forces TCP sockets). When no listed HCA
# works NCCL falls back to sockets without an error, at 10-50x less
# bandwidth: on a new cluster check for "NET/IB" in NCCL_DEBUG=INFO output.
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-0}

# RoCE only: the GID index of the RoCE v2 address (`show_gids`; often 3).
# InfiniBand proper leaves it unset.
# export NCCL_IB_GID_INDEX=3

# GPUDirect RDMA between a GPU and an HCA up to this PCIe distance (PIX: same
# switch, PXB: across switches, PHB: through the CPU). NCCL's topology
# detection usually gets it right; set it when `NCCL_DEBUG=INFO` shows
# "GDRDMA" missing on a system that supports it.
# export NCCL_NET_GDR_LEVEL=PHB

# WARN prints only problems; INFO shows the chosen transports and rings at
# start-up (the first thing to check on a new cluster).
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# --- MPI over UCX (CPU tensors, bootstrap, checkpoint I/O) ------------------

# OpenMPI's point-to-point layer: UCX drives InfiniBand (and shared memory
# within a node); the ob1 layer with the openib BTL is deprecated.
export OMPI_MCA_pml=${OMPI_MCA_pml:-ucx}

# One-sided MPI (MPI-IO's collective buffering uses it) over UCX as well.
export OMPI_MCA_osc=${OMPI_MCA_osc:-ucx}

# Keep the legacy openib and uct BTLs from loading (they warn, or grab the
# HCA before UCX does).
export OMPI_MCA_btl=${OMPI_MCA_btl:-^openib,uct}

# Devices UCX may use: "all", or device:port pairs (mlx5_0:1). Restricting
# it to the compute HCAs keeps MPI off a storage or management NIC.
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-all}

# Transports UCX may use; "all" lets it choose (rc/dc verbs across nodes,
# shared memory within one). Narrow to rc,sm,self when debugging.
export UCX_TLS=${UCX_TLS:-all}

# Mellanox HCOLL collectives, when installed, have hung MPI_Comm_split and
# MPI-IO in some versions; colossal's large collectives go through NCCL.
export OMPI_MCA_coll_hcoll_enable=${OMPI_MCA_coll_hcoll_enable:-0}
