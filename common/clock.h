/* clock.h - the daemon's one clock: CLOCK_MONOTONIC in milliseconds and
 * microseconds (deadlines, idle times, durations; never wall time). */
#ifndef CKV_COMMON_CLOCK_H
#define CKV_COMMON_CLOCK_H

#include <stdint.h>

uint64_t ckv_now_ms(void);
uint64_t ckv_now_us(void);

#endif
