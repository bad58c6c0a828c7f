/* Umbrella header: everything public in libcolossal-core. */
#ifndef COLOSSAL_H
#define COLOSSAL_H
#include "colossal/base.h"
#include "colossal/config.h"
#include "colossal/cluster.h"
#endif
