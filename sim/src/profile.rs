//! Engine profiles: what one simulated GPU pod costs per engine step, how many KV blocks it has and
//! how large a token's KV is.
//!
//! `seed-demo` (the default) is kvsim's original calibration, chosen for the demo and not measured:
//! a ~7,500-token uncached prompt takes ≈3 s to its first token and the same prompt from the prefix
//! cache well under a second. Every other profile is a published fit of real vLLM, copied unchanged
//! from llm-d's simulator BLIS: repository `inference-sim/inference-sim`, file `defaults.yaml`
//! (read at commit 1a6eb353412e981dba604fccd5096da4e8aee6da; identical at 3d79c654c2037299de0d656d57bbbf693edde7df),
//! list `models`, one entry per (`id`, `GPU`, `tensor_parallelism`, `vllm_version`) with keys
//! `beta_coeffs`, `alpha_coeffs` and `total_kv_blocks`. BLIS applies them in
//! `sim/latency` (`BlackboxLatencyModel`):
//!
//! - `StepTime` = β0 + β1 · (cache-miss prefill tokens in the step) + β2 · (decode tokens in the
//!   step), in µs. The fit has no term for context length, batch size or attention cost: a decode
//!   token costs β2 whether its context is 100 or 100,000 tokens (see [`Profile::step_us`]).
//! - `QueueingTime` = α0 + α1 · (input length), in µs, from arrival until the request is queued in
//!   the scheduler (API-server processing: parsing, tokenisation).
//! - `OutputTokenProcessingTime` = α2 µs per output token, added to each token's observed latency
//!   (`req.ITL = step + α2`, E2E = TTFT + ΣITL: detokenisation and streaming on the host), not to
//!   the engine's step.
//!
//! The KV geometry (layers, KV heads, head dimension, dtype) gives the bytes a token's KV occupies,
//! which a P/D transfer moves: 2 (K and V) × layers × KV heads × head dim × bytes per element, from
//! each model's Hugging Face `config.json` (`num_hidden_layers`, `num_key_value_heads`,
//! `hidden_size / num_attention_heads`, `torch_dtype` bfloat16 = 2 bytes).
//!
//! Token budget and sequence cap: vLLM V1 defaults for the OpenAI server (`vllm/engine/arg_utils.py`,
//! `EngineArgs.get_batch_defaults`, `UsageContext.OPENAI_API_SERVER`): on GPUs with ≥70 GiB that are
//! not A100 (H100-class) `max_num_batched_tokens` 8192 and `max_num_seqs` 1024; otherwise (A100)
//! 2048 and 256. BLIS's `defaults.yaml` does not record the values its traces ran with.

/// How a profile turns a step's tokens into time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepModel {
    /// kvsim's seed calibration: a prefill costs `overhead + per_token · tokens`, a decode step
    /// `base + per_seq · sequences`, and a step holding both costs the sum. Parameters come from
    /// [`super::SimConfig`] (its `prefill_*` and `decode_*` fields) so tests can change them.
    Seed,
    /// BLIS's blackbox fit: β0 + β1 · prefill tokens + β2 · decode tokens (µs).
    Fitted { beta: [f64; 3] },
}

/// A (model, GPU, tensor parallelism) the simulator can stand in for.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    /// Where the numbers come from, in one line.
    pub source: &'static str,
    pub step: StepModel,
    /// α0 (µs), α1 (µs per input token), α2 (µs per output token); zero where not published.
    pub alpha: [f64; 3],
    pub num_gpu_blocks: usize,
    pub block_size: usize,
    /// vLLM's `max_num_batched_tokens`: one budget per step shared by decodes (one token each) and
    /// prefill chunks. `None`: the seed model's separate prefill-only budget
    /// (`chunked_prefill_tokens`, 0 = whole prefills) with decodes outside it.
    pub max_num_batched_tokens: Option<usize>,
    pub max_num_seqs: usize,
    /// KV bytes per token (all layers, K and V, all tensor-parallel ranks); 0 = unknown.
    pub kv_bytes_per_token: usize,
}

/// 2 · layers · KV heads · head dim · bytes per element.
const fn kv_bytes(layers: usize, kv_heads: usize, head_dim: usize, dtype_bytes: usize) -> usize {
    2 * layers * kv_heads * head_dim * dtype_bytes
}

/// vLLM's default KV block size (`--block-size`, `CacheConfig.block_size` = 16 on CUDA); BLIS uses
/// the same.
const VLLM_BLOCK_SIZE: usize = 16;

pub const SEED_DEMO: Profile = Profile {
    name: "seed-demo",
    source: "kvsim seed calibration, not a measurement: prefill 40 ms + 0.4 ms/uncached token, \
             decode 15 ms + 0.5 ms/sequence, mixed step = sum (3.04 s cold for 7,500 tokens)",
    step: StepModel::Seed,
    alpha: [0.0; 3],
    num_gpu_blocks: 4096,
    block_size: 16,
    max_num_batched_tokens: None,
    max_num_seqs: 32,
    kv_bytes_per_token: 0,
};

/// Every profile `--profile` accepts; the first is the default.
pub const PROFILES: &[Profile] = &[
    SEED_DEMO,
    // inference-sim/inference-sim defaults.yaml, models[id=meta-llama/llama-3.1-8b-instruct,
    // GPU=H100, tensor_parallelism=1, vllm_version=vllm/vllm-openai:v0.8.4]: beta_coeffs,
    // alpha_coeffs, total_kv_blocks (best_loss 379.05).
    // KV: Llama-3.1-8B config.json: 32 layers, 8 KV heads, head dim 4096/32 = 128, bfloat16.
    Profile {
        name: "llama-3.1-8b-h100",
        source: "BLIS fit (inference-sim/inference-sim defaults.yaml, meta-llama/llama-3.1-8b-instruct, \
                 H100, TP 1, vLLM 0.8.4): step 5752.7 us + 17.25 us/prefill token + 6.00 us/decode token, \
                 29,205 blocks of 16",
        step: StepModel::Fitted {
            beta: [5752.705191348184, 17.25086436834028, 5.999143920128404],
        },
        alpha: [232.46191091038054, 1.752360364195244, 3357.4400353290152],
        num_gpu_blocks: 29205,
        block_size: VLLM_BLOCK_SIZE,
        max_num_batched_tokens: Some(8192),
        max_num_seqs: 1024,
        kv_bytes_per_token: kv_bytes(32, 8, 128, 2),
    },
    // inference-sim/inference-sim defaults.yaml, models[id=meta-llama/llama-3.1-8b-instruct,
    // GPU=A100-80, tensor_parallelism=1, vllm_version=vllm/vllm-openai:v0.8.4] (best_loss 335.98).
    // The older GPU generation of the same model, for mixed pools. vLLM's A100 defaults: 2048, 256.
    Profile {
        name: "llama-3.1-8b-a100",
        source: "BLIS fit (inference-sim/inference-sim defaults.yaml, meta-llama/llama-3.1-8b-instruct, \
                 A100-80, TP 1, vLLM 0.8.4): step 16441.5 us + 47.84 us/prefill token + 18.21 us/decode token, \
                 29,205 blocks of 16",
        step: StepModel::Fitted {
            beta: [16441.531547147923, 47.837412108198656, 18.20560632171683],
        },
        alpha: [7739.7334212001515, 2.308926798943791, 6276.246189076296],
        num_gpu_blocks: 29205,
        block_size: VLLM_BLOCK_SIZE,
        max_num_batched_tokens: Some(2048),
        max_num_seqs: 256,
        kv_bytes_per_token: kv_bytes(32, 8, 128, 2),
    },
    // inference-sim/inference-sim defaults.yaml, models[id=meta-llama/llama-3.3-70b-instruct,
    // GPU=H100, tensor_parallelism=4, vllm_version=vllm/vllm-openai:v0.8.4] (best_loss 295.61).
    // KV: Llama-3.3-70B config.json: 80 layers, 8 KV heads, head dim 8192/64 = 128, bfloat16.
    Profile {
        name: "llama-3.3-70b-h100-tp4",
        source: "BLIS fit (inference-sim/inference-sim defaults.yaml, meta-llama/llama-3.3-70b-instruct, \
                 H100, TP 4, vLLM 0.8.4): step 12601.3 us + 76.42 us/prefill token + 66.84 us/decode token, \
                 128,273 blocks of 16",
        step: StepModel::Fitted {
            beta: [12601.271149123822, 76.42284100369776, 66.84396200500741],
        },
        alpha: [2597.3171308592136, 9.950912552989394, 11511.44254521247],
        num_gpu_blocks: 128273,
        block_size: VLLM_BLOCK_SIZE,
        max_num_batched_tokens: Some(8192),
        max_num_seqs: 1024,
        kv_bytes_per_token: kv_bytes(80, 8, 128, 2),
    },
    // inference-sim/inference-sim defaults.yaml, models[id=qwen/qwen2.5-7b-instruct, GPU=H100,
    // tensor_parallelism=1, vllm_version=vllm/vllm-openai:v0.8.4] (best_loss 489.87). Its β2
    // (453 us per decode token) is the fit as published, not a kvsim choice.
    // KV: Qwen2.5-7B config.json: 28 layers, 4 KV heads, head dim 3584/28 = 128, bfloat16.
    Profile {
        name: "qwen2.5-7b-h100",
        source: "BLIS fit (inference-sim/inference-sim defaults.yaml, qwen/qwen2.5-7b-instruct, \
                 H100, TP 1, vLLM 0.8.4): step 1602.2 us + 19.87 us/prefill token + 452.94 us/decode token, \
                 67,659 blocks of 16",
        step: StepModel::Fitted {
            beta: [1602.214225165806, 19.870256563814962, 452.93689651035174],
        },
        alpha: [5223.7601312008765, 2.4114266267351026, 5368.0632635001375],
        num_gpu_blocks: 67659,
        block_size: VLLM_BLOCK_SIZE,
        max_num_batched_tokens: Some(8192),
        max_num_seqs: 1024,
        kv_bytes_per_token: kv_bytes(28, 4, 128, 2),
    },
];

/// A profile by name.
pub fn find(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
}

/// `name: source` of a profile by name, for benchmark tables (`None` if unknown).
pub fn describe(name: &str) -> Option<String> {
    find(name).map(Profile::describe)
}

/// Names `--profile` accepts.
pub fn names() -> Vec<&'static str> {
    PROFILES.iter().map(|p| p.name).collect()
}

/// The default profile, `seed-demo`.
pub fn default_profile() -> &'static Profile {
    &PROFILES[0]
}

impl Profile {
    /// `name: source`, the line benchmarks print with their tables.
    pub fn describe(&self) -> String {
        format!("{}: {}", self.name, self.source)
    }

    pub fn is_fitted(&self) -> bool {
        matches!(self.step, StepModel::Fitted { .. })
    }

    /// A fitted profile's step time in µs for exactly these tokens (`None` for the seed model,
    /// whose parameters live in the configuration). No context-length term: BLIS's blackbox fit has
    /// none.
    pub fn step_us(&self, prefill_tokens: usize, decode_tokens: usize) -> Option<f64> {
        match self.step {
            StepModel::Seed => None,
            StepModel::Fitted { beta } => {
                Some(beta[0] + beta[1] * prefill_tokens as f64 + beta[2] * decode_tokens as f64)
            }
        }
    }

    /// α0 + α1 · input length, µs from arrival to the scheduler's queue.
    pub fn queueing_us(&self, input_tokens: usize) -> f64 {
        self.alpha[0] + self.alpha[1] * input_tokens as f64
    }

    /// α2, µs added to each output token's delivery.
    pub fn output_token_us(&self) -> f64 {
        self.alpha[2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fitted(name: &str) -> &'static Profile {
        find(name).expect("profile")
    }

    /// Hand-computed from defaults.yaml's coefficients: a batch of 512 uncached prefill tokens and 7
    /// decodes, a pure decode batch of 32, and a single 2,048-token prefill chunk.
    #[test]
    fn fitted_step_times_follow_the_published_formula() {
        /// (prefill tokens, decode tokens, µs)
        type Batch = (usize, usize, f64);
        let cases: &[(&str, [Batch; 3])] = &[
            (
                "llama-3.1-8b-h100",
                [
                    // 5752.705191348184 + 17.25086436834028·512 + 5.999143920128404·7
                    (512, 7, 14_627.141_755_379_307),
                    // 5752.705191348184 + 5.999143920128404·32
                    (0, 32, 5_944.677_796_792_293),
                    // 5752.705191348184 + 17.25086436834028·2048
                    (2048, 0, 41_082.475_417_709_08),
                ],
            ),
            (
                "llama-3.3-70b-h100-tp4",
                [
                    // 12601.271149123822 + 76.42284100369776·512 + 66.84396200500741·7
                    (512, 7, 52_197.673_477_052_12),
                    (0, 32, 14_740.277_933_284_06),
                    (2048, 0, 169_115.249_524_696_82),
                ],
            ),
            (
                "llama-3.1-8b-a100",
                [
                    (512, 7, 41_061.725_790_797_65),
                    (0, 32, 17_024.110_949_442_86),
                    (2048, 0, 114_412.551_544_738_77),
                ],
            ),
            (
                "qwen2.5-7b-h100",
                [
                    (512, 7, 14_946.343_861_411_53),
                    (0, 32, 16_096.194_913_497_062),
                    (2048, 0, 42_296.499_667_858_85),
                ],
            ),
        ];
        for (name, batches) in cases {
            let p = fitted(name);
            for (prefill, decode, want) in batches {
                let got = p.step_us(*prefill, *decode).expect("fitted");
                assert!(
                    (got - want).abs() < 1e-6,
                    "{name}: {prefill} prefill + {decode} decode = {got} us, want {want}"
                );
            }
        }
    }

    #[test]
    fn published_capacities_and_overheads() {
        let p = fitted("llama-3.1-8b-h100");
        assert_eq!(p.num_gpu_blocks, 29205);
        assert_eq!(p.block_size, 16);
        assert_eq!(p.max_num_batched_tokens, Some(8192));
        assert_eq!(p.kv_bytes_per_token, 131_072, "128 KiB per token");
        assert!((p.queueing_us(1000) - (232.46191091038054 + 1752.360364195244)).abs() < 1e-9);
        assert!((p.output_token_us() - 3357.4400353290152).abs() < 1e-12);
        let p = fitted("llama-3.3-70b-h100-tp4");
        assert_eq!(p.num_gpu_blocks, 128273);
        assert_eq!(p.kv_bytes_per_token, 327_680, "320 KiB per token");
        assert_eq!(fitted("qwen2.5-7b-h100").kv_bytes_per_token, 57_344);
        assert_eq!(
            fitted("llama-3.1-8b-a100").max_num_batched_tokens,
            Some(2048)
        );
    }

    #[test]
    fn seed_demo_is_the_default_and_every_profile_describes_itself() {
        let d = default_profile();
        assert_eq!(d.name, "seed-demo");
        assert!(!d.is_fitted());
        assert_eq!(d.step_us(100, 1), None);
        for p in PROFILES {
            let line = p.describe();
            assert!(line.starts_with(p.name) && !line.contains('\n'), "{line}");
            if p.is_fitted() {
                assert!(
                    line.contains("inference-sim/inference-sim defaults.yaml"),
                    "{line}"
                );
            }
        }
        assert!(find("no-such-gpu").is_none());
    }
}
