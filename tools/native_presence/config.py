"""tools/phase_profile/envoy_config.py's Envoy (a kvroute listener and a plain one on the same
kvsim pods) with two more listeners like the plain one: `native`, the do-nothing dynamic module
(noop_module.c), and `presence`, kvroute with no pools (it only guards headers; every callback
still enters its V8 VM)."""
import subprocess, sys

sim, wasm, kv, plain, native, presence, admin = sys.argv[1:8]
here = sys.path[0]
y = subprocess.run([sys.executable, f"{here}/../phase_profile/envoy_config.py", sim, wasm, kv, plain, admin],
                   check=True, capture_output=True, text=True).stdout
listener = y[y.index("  - name: plain"):y.index("  clusters:")]
router = "          - name: envoy.filters.http.router"
native_filter = """          - name: envoy.filters.http.dynamic_modules
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
              dynamic_module_config: {name: noop}
              filter_name: noop
"""
presence_filter = f"""          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: presence
                root_id: kvroute
                vm_config:
                  vm_id: presence
                  runtime: envoy.wasm.runtime.v8
                  code: {{local: {{filename: {wasm}}}}}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: '{{"pools": []}}'
                failure_policy: FAIL_RELOAD
"""


def clone(name, port, extra):
    return (listener.replace("name: plain", f"name: {name}")
            .replace(f"port_value: {plain}", f"port_value: {port}")
            .replace("stat_prefix: plain", f"stat_prefix: {name}")
            .replace(router, extra + router))


y = y.replace(listener, listener + clone("native", native, native_filter)
              + clone("presence", presence, presence_filter))
print(y)
