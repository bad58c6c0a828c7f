# ops module: sources added by its owner
