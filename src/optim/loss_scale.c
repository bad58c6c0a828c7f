/* Dynamic loss scaling for f16 training: the state machine only. Whether a
 * step overflowed is decided by the caller over every rank (the global
 * gradient norm is not finite), so this file stays pure and every rank
 * takes the same decision from the same input. */
#include "cai_config.h"
#include "colossal/optim.h"

#include <math.h>
#include <string.h>

cai_loss_scale_config cai_loss_scale_config_default(void) {
    cai_loss_scale_config c;
    memset(&c, 0, sizeof c);
    c.dynamic = 1;
    c.init_scale = 65536.0f;
    c.growth_factor = 2.0f;
    c.backoff_factor = 0.5f;
    c.growth_interval = 1000;
    c.hysteresis = 2;
    c.min_scale = 1.0f;
    c.max_scale = 16777216.0f;
    return c;
}

cai_loss_scale_config cai_loss_scale_config_none(void) {
    cai_loss_scale_config c = cai_loss_scale_config_default();
    c.dynamic = 0;
    c.init_scale = 1.0f;
    return c;
}

cai_status cai_loss_scale_config_check(const cai_loss_scale_config *c) {
    CAI_CHECK_ARG(c, "cai_loss_scale_config_check: NULL config");
    if (!(c->min_scale > 0) || !isfinite(c->min_scale) || !(c->max_scale >= c->min_scale) || !isfinite(c->max_scale))
        return CAI_ERROR(CAI_ERR_CONFIG, "loss_scale.min=%g and loss_scale.max=%g must be finite with 0 < min <= max",
                         (double)c->min_scale, (double)c->max_scale);
    if (!(c->init_scale >= c->min_scale && c->init_scale <= c->max_scale))
        return CAI_ERROR(CAI_ERR_CONFIG, "loss_scale.initial=%g must lie in [loss_scale.min=%g, loss_scale.max=%g]",
                         (double)c->init_scale, (double)c->min_scale, (double)c->max_scale);
    if (!c->dynamic) return CAI_OK;
    if (!(c->growth_factor >= 1) || !isfinite(c->growth_factor))
        return CAI_ERROR(CAI_ERR_CONFIG, "loss_scale.growth_factor=%g must be finite and >= 1 (2 doubles the scale)",
                         (double)c->growth_factor);
    if (!(c->backoff_factor > 0 && c->backoff_factor < 1))
        return CAI_ERROR(CAI_ERR_CONFIG, "loss_scale.backoff_factor=%g must lie in (0, 1) (0.5 halves the scale)",
                         (double)c->backoff_factor);
    if (c->growth_interval < 1)
        return CAI_ERROR(CAI_ERR_CONFIG, "loss_scale.growth_interval=%d must be >= 1 good steps", c->growth_interval);
    if (c->hysteresis < 1)
        return CAI_ERROR(CAI_ERR_CONFIG, "loss_scale.hysteresis=%d must be >= 1 (1: back off at the first overflow)",
                         c->hysteresis);
    return CAI_OK;
}

void cai_loss_scaler_init(cai_loss_scaler *s, const cai_loss_scale_config *cfg) {
    memset(s, 0, sizeof *s);
    s->cfg = cfg ? *cfg : cai_loss_scale_config_none();
    s->scale = s->cfg.init_scale;
    s->hysteresis_left = s->cfg.hysteresis;
}

int cai_loss_scaler_update(cai_loss_scaler *s, int overflow) {
    if (overflow) {
        s->overflows++;
        s->good_steps = 0;
        if (!s->cfg.dynamic) return 0;
        /* The budget is not refilled by a backoff, only by growth: a run
         * that keeps overflowing keeps halving (Megatron's rule). */
        if (--s->hysteresis_left <= 0) {
            s->hysteresis_left = 0;
            s->scale = fmaxf(s->scale * s->cfg.backoff_factor, s->cfg.min_scale);
        }
        return 0;
    }
    if (!s->cfg.dynamic) return 1;
    if (++s->good_steps >= s->cfg.growth_interval) {
        s->good_steps = 0;
        s->hysteresis_left = s->cfg.hysteresis;
        s->scale = fminf(s->scale * s->cfg.growth_factor, s->cfg.max_scale);
    }
    return 1;
}
