/* Umbrella header: everything public in libcolossal-core, in layer order. */
#ifndef COLOSSAL_H
#define COLOSSAL_H
#include "colossal/base.h"
#include "colossal/config.h"
#include "colossal/cluster.h"
#include "colossal/tensor.h"
#include "colossal/ops.h"
#include "colossal/model.h"
#include "colossal/moe.h"
#include "colossal/optim.h"
#include "colossal/parallel.h"
#include "colossal/schedule.h"
#include "colossal/ckpt.h"
#include "colossal/data.h"
#include "colossal/run.h"
#include "colossal/infer.h"
#include "colossal/rl.h"
#endif
