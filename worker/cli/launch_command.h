// pstar launch's phases beyond parsing (worker/dist/launch_options.h): the
// rendezvous it gives its ranks, then a supervisor that forks and watches them.
#pragma once

#include "worker/core/status.h"
#include "worker/dist/launch_options.h"

namespace pstar::cli {

// --standalone's free loopback port, and the store's secret: made here on
// one node unless `inherited_token` (PSTAR_STORE_TOKEN) is set; across
// nodes left unset with a warning, for every node must share one.
Status SetRendezvous(LaunchOptions* options, const char* inherited_token);

}  // namespace pstar::cli
