# ckpt module: sources added by its owner
