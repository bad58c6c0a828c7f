# Apps and tools: each links libcolossal-core and stays short.
