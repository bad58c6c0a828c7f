# model module: sources added by its owner
