/* placeholder */
#include "colossal/rl.h"
