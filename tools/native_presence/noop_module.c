/* A do-nothing HTTP filter for Envoy's dynamic modules (native shared libraries behind a C ABI,
 * `envoy.filters.http.dynamic_modules`): every callback returns Continue at once. It measures what
 * a native filter's mere presence costs a request, beside what a Proxy-Wasm filter's does (kvroute
 * with no pools: every callback enters V8). Written against the ABI's calling convention only
 * (pointers in, an enum or pointer out); no argument is read, so the exact parameter list of the
 * Envoy version that loads it does not matter. Envoy warns that the ABI version string is not its
 * own and loads it (it only logs a mismatch). Not shipped: `run.sh` builds it with gcc. */
#include <stddef.h>
#include <stdint.h>

static int config_object;
static int filter_object;

const char *envoy_dynamic_module_on_program_init(void) { return "kvroute-presence-experiment"; }

void *envoy_dynamic_module_on_http_filter_config_new(void) { return &config_object; }
void envoy_dynamic_module_on_http_filter_config_destroy(void) {}
void *envoy_dynamic_module_on_http_filter_per_route_config_new(void) { return NULL; }
void envoy_dynamic_module_on_http_filter_per_route_config_destroy(void) {}
void *envoy_dynamic_module_on_http_filter_new(void) { return &filter_object; }
void envoy_dynamic_module_on_http_filter_destroy(void) {}

/* Continue is 0 in every status enum of the ABI. */
int envoy_dynamic_module_on_http_filter_request_headers(void) { return 0; }
int envoy_dynamic_module_on_http_filter_request_body(void) { return 0; }
int envoy_dynamic_module_on_http_filter_request_trailers(void) { return 0; }
int envoy_dynamic_module_on_http_filter_response_headers(void) { return 0; }
int envoy_dynamic_module_on_http_filter_response_body(void) { return 0; }
int envoy_dynamic_module_on_http_filter_response_trailers(void) { return 0; }
int envoy_dynamic_module_on_http_filter_local_reply(void) { return 0; }
void envoy_dynamic_module_on_http_filter_stream_complete(void) {}
void envoy_dynamic_module_on_http_filter_scheduled(void) {}
void envoy_dynamic_module_on_http_filter_config_scheduled(void) {}
void envoy_dynamic_module_on_http_filter_http_callout_done(void) {}
void envoy_dynamic_module_on_http_filter_config_http_callout_done(void) {}
void envoy_dynamic_module_on_http_filter_http_stream_headers(void) {}
void envoy_dynamic_module_on_http_filter_http_stream_data(void) {}
void envoy_dynamic_module_on_http_filter_http_stream_trailers(void) {}
void envoy_dynamic_module_on_http_filter_http_stream_complete(void) {}
void envoy_dynamic_module_on_http_filter_http_stream_reset(void) {}
void envoy_dynamic_module_on_http_filter_config_http_stream_headers(void) {}
void envoy_dynamic_module_on_http_filter_config_http_stream_data(void) {}
void envoy_dynamic_module_on_http_filter_config_http_stream_trailers(void) {}
void envoy_dynamic_module_on_http_filter_config_http_stream_complete(void) {}
void envoy_dynamic_module_on_http_filter_config_http_stream_reset(void) {}
void envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(void) {}
void envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(void) {}
