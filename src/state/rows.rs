//! The shape both boards share (`super::inflight`, `super::fits`): one shared-data value holding a
//! row per VM, each VM rewriting only its own row, readers taking the other VMs' rows written within
//! a time to live. Text, one row per line after a format line: `<vm id hex> <written ms> <entry> …`.
//! A value without this board's format line (another module version) decodes as empty; unreadable
//! rows and entries are skipped, never trusted.

/// One entry of a row: how it is written (no spaces) and read back.
pub trait Entry: Clone {
    /// The format line the board's value starts with.
    const FORMAT: &'static str;
    fn write(&self, out: &mut String);
    fn parse(field: &str) -> Option<Self>;
}

#[derive(Debug, Clone, PartialEq)]
struct Row<E> {
    vm: u64,
    written_ms: u64,
    entries: Vec<E>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RowBoard<E> {
    rows: Vec<Row<E>>,
}

impl<E> Default for RowBoard<E> {
    fn default() -> Self {
        RowBoard { rows: Vec::new() }
    }
}

impl<E: Entry> RowBoard<E> {
    pub fn decode(bytes: &[u8]) -> Self {
        let text = String::from_utf8_lossy(bytes);
        let mut lines = text.lines();
        if lines.next() != Some(E::FORMAT) {
            return RowBoard::default();
        }
        RowBoard {
            rows: lines.filter_map(parse_row).collect(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        use std::fmt::Write as _;
        let mut out = String::from(E::FORMAT);
        out.push('\n');
        for row in &self.rows {
            let _ = write!(out, "{:x} {}", row.vm, row.written_ms);
            for e in &row.entries {
                out.push(' ');
                e.write(&mut out);
            }
            out.push('\n');
        }
        out.into_bytes()
    }

    /// Replaces `vm`'s row and drops rows older than `ttl_ms`.
    pub fn put_row(&mut self, vm: u64, now_ms: u64, entries: Vec<E>, ttl_ms: u64) {
        self.rows
            .retain(|r| r.vm != vm && now_ms.saturating_sub(r.written_ms) <= ttl_ms);
        self.rows.push(Row {
            vm,
            written_ms: now_ms,
            entries,
        });
        self.rows.sort_by_key(|r| r.vm);
    }

    /// The entries of every VM but `vm` whose rows are younger than `ttl_ms`.
    pub fn others(&self, vm: u64, now_ms: u64, ttl_ms: u64) -> impl Iterator<Item = &E> {
        self.entries_where(now_ms, ttl_ms, move |id| id != vm)
    }

    /// The entries of the rows younger than `ttl_ms` whose id `keep` accepts.
    pub fn entries_where(
        &self,
        now_ms: u64,
        ttl_ms: u64,
        keep: impl Fn(u64) -> bool,
    ) -> impl Iterator<Item = &E> {
        self.rows
            .iter()
            .filter(move |r| keep(r.vm) && now_ms.saturating_sub(r.written_ms) <= ttl_ms)
            .flat_map(|r| r.entries.iter())
    }

    pub fn rows(&self) -> usize {
        self.rows.len()
    }
}

fn parse_row<E: Entry>(line: &str) -> Option<Row<E>> {
    let mut fields = line.split(' ');
    let vm = u64::from_str_radix(fields.next()?, 16).ok()?;
    let written_ms = fields.next()?.parse().ok()?;
    Some(Row {
        vm,
        written_ms,
        entries: fields.filter_map(E::parse).collect(),
    })
}
