/* server_metrics.h - the metrics page's figures, read off the daemon's state. */
#ifndef CKV_DAEMON_SERVER_METRICS_H
#define CKV_DAEMON_SERVER_METRICS_H

#include "daemon/daemon.h"

/* Formats and publishes the metrics snapshot (metrics.h). */
void ckv_server_publish_metrics(ckv_server *s);

#endif
