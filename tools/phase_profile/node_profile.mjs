// Runs examples/request_cost.rs built for wasm32-wasip1 under Node's V8 with TurboFan only, as
// Envoy runs the plugin (`--no-liftoff`), every proxy-wasm import a stub that answers 0: the
// profile (`node --cpu-prof`) names the plugin's functions, which Envoy's stripped binary cannot.
//
//   CARGO_PROFILE_RELEASE_STRIP=false cargo build --release --target wasm32-wasip1 \
//     --example request_cost --features testing
//   node --no-liftoff --cpu-prof --cpu-prof-dir=DIR tools/phase_profile/node_profile.mjs \
//     target/wasm32-wasip1/release/examples/request_cost.wasm repeat
//   python3 tools/phase_profile/cpuprofile_top.py DIR/*.cpuprofile
import { readFileSync } from "node:fs";
import { WASI } from "node:wasi";
import { argv } from "node:process";

const [, , wasmPath, ...args] = argv;
const wasi = new WASI({ version: "preview1", args: ["request_cost", ...args], env: {} });
const module = await WebAssembly.compile(readFileSync(wasmPath));
const imports = { wasi_snapshot_preview1: wasi.wasiImport };
for (const imp of WebAssembly.Module.imports(module)) {
  if (imp.module !== "wasi_snapshot_preview1" && imp.kind === "function") {
    imports[imp.module] ??= {};
    imports[imp.module][imp.name] = () => 0;
  }
}
const instance = await WebAssembly.instantiate(module, imports);
// The plugin's library also exports `_initialize` (proxy-wasm's entry), which Node's WASI refuses
// beside `_start`: hand it the command's exports only.
const { _start, memory } = instance.exports;
wasi.start({ exports: { _start, memory } });
