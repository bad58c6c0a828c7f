# tensor module: sources added by its owner
