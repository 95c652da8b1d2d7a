//! `multi-turn` and `agent`: sessions whose every turn resends the conversation so far, the
//! server's replies included, so their prefixes grow turn by turn; a fixed number of sessions is
//! in progress at once, rotated in a seeded order.

use super::{rng_for, Family, Message, Slot, Vocab};
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Chat conversations where every turn resends the whole conversation so far: the prefix grows by
/// a question and a reply per turn, and only the pod that served the previous turn holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MultiTurnParams {
    /// Conversations in progress at once; a finished one is replaced by a fresh one.
    pub conversations: usize,
    /// Turns per conversation.
    pub turns: u32,
    /// Words in each conversation's system prompt (distinct per conversation).
    pub system_words: usize,
    /// Words in each user message, inclusive range.
    pub user_words: (usize, usize),
    /// `max_tokens` of each turn, inclusive range.
    pub max_tokens: (u32, u32),
    /// Start the first sessions part-way through, with seeded stand-ins as their earlier replies, spread
    /// evenly over the turns: the run is in its steady-state mix of short and long prompts from the
    /// first request, and sessions end (and fresh ones start cold) one at a time instead of in waves.
    pub stagger: bool,
}

impl Default for MultiTurnParams {
    fn default() -> Self {
        Self {
            conversations: 16,
            turns: 6,
            system_words: 1000,
            user_words: (40, 120),
            max_tokens: (64, 256),
            stagger: true,
        }
    }
}

/// Long-context agent sessions: a preamble shared by every session (tools, instructions), a large
/// per-session context, and per step the previous output plus a tool result appended. With the
/// defaults the prompt grows from ~6,000 to ~12,000 words over 8 steps (mean ~9,000) against ~200
/// output tokens, the ≈45:1 input:output ratio of coding agents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentParams {
    /// Sessions in progress at once; a finished one is replaced by a fresh one.
    pub sessions: usize,
    /// Steps (requests) per session.
    pub steps: u32,
    /// Words in the preamble shared by all sessions.
    pub preamble_words: usize,
    /// Words in each session's initial context (task, files).
    pub context_words: usize,
    /// Words in each tool result appended after a step, inclusive range.
    pub tool_result_words: (usize, usize),
    /// `max_tokens` of each step, inclusive range.
    pub max_tokens: (u32, u32),
    /// Start the first sessions part-way through, with seeded stand-ins as their earlier replies, spread
    /// evenly over the steps: the run is in its steady-state mix of short and long prompts from the
    /// first request, and sessions end (and fresh ones start cold) one at a time instead of in waves.
    pub stagger: bool,
}

impl Default for AgentParams {
    fn default() -> Self {
        Self {
            sessions: 8,
            steps: 8,
            preamble_words: 1500,
            context_words: 4500,
            tool_result_words: (500, 800),
            max_tokens: (150, 250),
            stagger: true,
        }
    }
}

/// Recorded replies of one multi-turn conversation or agent session.
#[derive(Debug, Default)]
struct SessionState {
    /// The conversation's system prompt or the agent session's context, generated once: rebuilding
    /// ~10,000 words per request would make a debug-build driver CPU-bound.
    base: Option<String>,
    /// Per turn: the user message (multi-turn) or the tool result appended before it (agent), and
    /// the turn's `max_tokens`.
    inputs: HashMap<u32, (String, u32)>,
    /// Per turn: what the server returned, or the stand-in.
    replies: HashMap<u32, String>,
}

impl SessionState {
    fn base(&mut self, make: impl FnOnce() -> String) -> String {
        self.base.get_or_insert_with(make).clone()
    }

    fn input(&mut self, t: u32, make: impl FnOnce() -> (String, u32)) -> (String, u32) {
        self.inputs.entry(t).or_insert_with(make).clone()
    }

    /// The recorded reply of turn `t`, or its seeded stand-in of `max_tokens` words.
    fn reply(&mut self, t: u32, max_tokens: u32, stand_in: impl FnOnce(u32) -> String) -> String {
        self.replies
            .entry(t)
            .or_insert_with(|| stand_in(max_tokens))
            .clone()
    }
}

/// The rotation of session slots used by multi-turn and agent workloads.
#[derive(Debug)]
struct Rotation {
    /// Session id currently occupying each slot, and the next turn it will be handed.
    slots: Vec<(u64, u32)>,
    /// Slot order, shuffled once: consecutive turns of one session are a full rotation apart, which
    /// is the most time a session can get to finish its previous turn.
    order: Vec<usize>,
    next_id: u64,
    turns_per_session: u32,
}

impl Rotation {
    /// With `stagger`, the session in slot j starts at turn ⌊j·turns/n⌋ (see `MultiTurnParams::stagger`).
    fn new(seed: u64, n: usize, turns_per_session: u32, stagger: bool) -> Self {
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rng_for(seed, "rotation", 0, 0));
        let first_turn = |j: u64| {
            if stagger {
                (j * u64::from(turns_per_session) / n.max(1) as u64) as u32
            } else {
                0
            }
        };
        Self {
            slots: (0..n as u64).map(|j| (j, first_turn(j))).collect(),
            order,
            next_id: n as u64,
            turns_per_session,
        }
    }

    /// The session and turn for the `index`-th slot; a session that has had all its turns is replaced.
    fn next(&mut self, index: u64) -> (u64, u32) {
        let pos = self
            .order
            .get((index % self.order.len().max(1) as u64) as usize)
            .copied()
            .unwrap_or(0);
        let next_id = &mut self.next_id;
        let turns_per_session = self.turns_per_session;
        match self.slots.get_mut(pos) {
            Some(slot) => {
                if slot.1 >= turns_per_session {
                    *slot = (*next_id, 0);
                    *next_id += 1;
                }
                let out = *slot;
                slot.1 += 1;
                out
            }
            None => (0, 0),
        }
    }
}

/// User message and `max_tokens` of turn `t` of conversation `id`.
fn conv_turn(seed: u64, vocab: &Vocab, p: &MultiTurnParams, id: u64, t: u32) -> (String, u32) {
    let mut rng = rng_for(seed, "conv-turn", id, u64::from(t));
    let n = rng.gen_range(p.user_words.0..=p.user_words.1);
    let user = vocab.text(&mut rng, n);
    (user, rng.gen_range(p.max_tokens.0..=p.max_tokens.1))
}

/// Tool result appended before step `t` (empty for step 0) and `max_tokens` of step `t`.
fn agent_step(seed: u64, vocab: &Vocab, p: &AgentParams, id: u64, t: u32) -> (String, u32) {
    let mut rng = rng_for(seed, "agent-step", id, u64::from(t));
    let n = rng.gen_range(p.tool_result_words.0..=p.tool_result_words.1);
    let tool = if t == 0 {
        String::new()
    } else {
        vocab.text(&mut rng, n)
    };
    (tool, rng.gen_range(p.max_tokens.0..=p.max_tokens.1))
}

/// Records `slot`'s reply in its session (`None`: the request failed, so the stand-in is resent);
/// forgets the session after its `last` turn.
fn record(sessions: &mut HashMap<u64, SessionState>, last: u32, slot: &Slot, reply: Option<&str>) {
    if slot.turn + 1 >= last {
        sessions.remove(&slot.session_id);
        return;
    }
    if let Some(text) = reply {
        sessions
            .entry(slot.session_id)
            .or_default()
            .replies
            .insert(slot.turn, text.to_owned());
    }
}

/// The seeded stand-in of turn `t`'s reply in session `id`.
fn stand_in(seed: u64, vocab: &Vocab, id: u64, t: u32) -> impl FnOnce(u32) -> String + '_ {
    move |n: u32| vocab.text(&mut rng_for(seed, "stand-in", id, u64::from(t)), n as usize)
}

#[derive(Debug)]
pub(super) struct Conversations {
    p: MultiTurnParams,
    rotation: Rotation,
    sessions: HashMap<u64, SessionState>,
}

impl Conversations {
    pub(super) fn new(seed: u64, p: &MultiTurnParams) -> Self {
        Self {
            p: p.clone(),
            rotation: Rotation::new(seed, p.conversations, p.turns, p.stagger),
            sessions: HashMap::new(),
        }
    }
}

impl Family for Conversations {
    fn next_session(&mut self, index: u64) -> (String, u64, u32) {
        let (id, turn) = self.rotation.next(index);
        (format!("conv-{id}"), id, turn)
    }

    fn messages(&mut self, seed: u64, vocab: &Vocab, slot: &Slot) -> (Vec<Message>, u32) {
        let p = &self.p;
        let id = slot.session_id;
        let state = self.sessions.entry(id).or_default();
        let system =
            state.base(|| vocab.text(&mut rng_for(seed, "conv-system", id, 0), p.system_words));
        let mut messages = vec![Message::new("system", system)];
        for t in 0..slot.turn {
            let (user, max_tokens) = state.input(t, || conv_turn(seed, vocab, p, id, t));
            messages.push(Message::new("user", user));
            let reply = state.reply(t, max_tokens, stand_in(seed, vocab, id, t));
            messages.push(Message::new("assistant", reply));
        }
        let (user, max_tokens) =
            state.input(slot.turn, || conv_turn(seed, vocab, p, id, slot.turn));
        messages.push(Message::new("user", user));
        (messages, max_tokens)
    }

    fn is_sequential(&self) -> bool {
        true
    }

    fn record_reply(&mut self, slot: &Slot, reply: Option<&str>) {
        record(&mut self.sessions, self.p.turns, slot, reply);
    }
}

#[derive(Debug)]
pub(super) struct Agents {
    p: AgentParams,
    preamble: String,
    rotation: Rotation,
    sessions: HashMap<u64, SessionState>,
}

impl Agents {
    pub(super) fn new(seed: u64, vocab: &Vocab, p: &AgentParams) -> Self {
        Self {
            p: p.clone(),
            preamble: vocab.text(&mut rng_for(seed, "agent-preamble", 0, 0), p.preamble_words),
            rotation: Rotation::new(seed, p.sessions, p.steps, p.stagger),
            sessions: HashMap::new(),
        }
    }
}

impl Family for Agents {
    fn next_session(&mut self, index: u64) -> (String, u64, u32) {
        let (id, turn) = self.rotation.next(index);
        (format!("agent-{id}"), id, turn)
    }

    fn messages(&mut self, seed: u64, vocab: &Vocab, slot: &Slot) -> (Vec<Message>, u32) {
        let p = &self.p;
        let id = slot.session_id;
        let state = self.sessions.entry(id).or_default();
        let context =
            state.base(|| vocab.text(&mut rng_for(seed, "agent-context", id, 0), p.context_words));
        let mut messages = vec![
            Message::new("system", self.preamble.clone()),
            Message::new("user", context),
        ];
        for t in 1..=slot.turn {
            let (_, prev_max) = state.input(t - 1, || agent_step(seed, vocab, p, id, t - 1));
            let reply = state.reply(t - 1, prev_max, stand_in(seed, vocab, id, t - 1));
            messages.push(Message::new("assistant", reply));
            let (tool, _) = state.input(t, || agent_step(seed, vocab, p, id, t));
            messages.push(Message::new("user", tool));
        }
        let (_, max_tokens) = state.input(slot.turn, || agent_step(seed, vocab, p, id, slot.turn));
        (messages, max_tokens)
    }

    fn is_sequential(&self) -> bool {
        true
    }

    fn record_reply(&mut self, slot: &Slot, reply: Option<&str>) {
        record(&mut self.sessions, self.p.steps, slot, reply);
    }
}
