//! The one table renderer of kvbench's text reports: a [`Table`] of string cells, each column
//! left- or right-aligned, written as aligned text ([`Table::text`]: columns two spaces apart, as
//! wide as their widest cell, the header underlined with dashes, trailing spaces trimmed) or as
//! Markdown ([`Table::markdown`]). A table may have no header (aligned rows only), and free lines
//! ([`Table::note`]) may follow any row.

use std::fmt::Write as _;

/// How a column's cells are padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

#[derive(Clone, Debug)]
enum Line {
    Row(Vec<String>),
    /// Written as is, outside the columns.
    Note(String),
}

/// Rows of cells under an optional header. Columns are right-aligned unless set otherwise
/// ([`Table::left`], [`Table::aligns`]).
#[derive(Clone, Debug, Default)]
pub struct Table {
    header: Option<Vec<String>>,
    aligns: Vec<Align>,
    indent: usize,
    lines: Vec<Line>,
}

impl Table {
    /// A table under `header`.
    pub fn new<S: AsRef<str>>(header: &[S]) -> Self {
        Self {
            header: Some(header.iter().map(|h| h.as_ref().to_owned()).collect()),
            ..Self::default()
        }
    }

    /// A table without a header: aligned rows only.
    pub fn headless() -> Self {
        Self::default()
    }

    /// The first `n` columns left-aligned, the others right-aligned.
    #[must_use]
    pub fn left(mut self, n: usize) -> Self {
        self.aligns = vec![Align::Left; n];
        self
    }

    /// The columns' alignments, first to last (columns past them right-aligned).
    #[must_use]
    pub fn aligns(mut self, aligns: &[Align]) -> Self {
        self.aligns = aligns.to_vec();
        self
    }

    /// Every text line (header, rule and rows; not the notes) starts with `n` spaces.
    #[must_use]
    pub fn indent(mut self, n: usize) -> Self {
        self.indent = n;
        self
    }

    /// One row; it may have fewer cells than the table has columns.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.lines
            .push(Line::Row(cells.into_iter().map(Into::into).collect()));
    }

    /// A line written as is after the rows so far.
    pub fn note(&mut self, text: impl Into<String>) {
        self.lines.push(Line::Note(text.into()));
    }

    fn rows(&self) -> impl Iterator<Item = &Vec<String>> {
        self.header
            .iter()
            .chain(self.lines.iter().filter_map(|l| match l {
                Line::Row(r) => Some(r),
                Line::Note(_) => None,
            }))
    }

    fn align_of(&self, column: usize) -> Align {
        self.aligns.get(column).copied().unwrap_or(Align::Right)
    }

    /// Each column's width: its widest cell, in characters.
    fn widths(&self) -> Vec<usize> {
        let columns = self.rows().map(Vec::len).max().unwrap_or(0);
        (0..columns)
            .map(|c| {
                self.rows()
                    .map(|r| r.get(c).map_or(0, |x| x.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    fn text_line(&self, out: &mut String, row: &[String], widths: &[usize]) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(c, (s, &w))| match self.align_of(c) {
                Align::Left => format!("{s:<w$}"),
                Align::Right => format!("{s:>w$}"),
            })
            .collect();
        let line = format!("{:indent$}{}", "", cells.join("  "), indent = self.indent);
        let _ = writeln!(out, "{}", line.trim_end());
    }

    /// Aligned text: columns two spaces apart, the header (if any) underlined with dashes as wide
    /// as the columns, each line's trailing spaces trimmed, every line ending with a newline.
    pub fn text(&self) -> String {
        let widths = self.widths();
        let mut out = String::new();
        if let Some(header) = &self.header {
            self.text_line(&mut out, header, &widths);
            let total = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
            let _ = writeln!(
                out,
                "{:indent$}{}",
                "",
                "-".repeat(total),
                indent = self.indent
            );
        }
        for line in &self.lines {
            match line {
                Line::Row(row) => self.text_line(&mut out, row, &widths),
                Line::Note(note) => {
                    let _ = writeln!(out, "{note}");
                }
            }
        }
        out
    }

    /// Markdown: `| a | b |` rows under the header (an empty one for a headless table) and its
    /// `|---|---:|` line (`---:` for a right-aligned column); `|` inside a cell escaped; every row
    /// as many cells as the table has columns; notes as lines of their own.
    pub fn markdown(&self) -> String {
        let columns = self.widths().len();
        let cells = |row: &[String]| -> String {
            let mut line = String::from("|");
            for c in 0..columns {
                let cell = row.get(c).map_or("", String::as_str).replace('|', "\\|");
                let _ = write!(line, " {cell} |");
            }
            line
        };
        let mut out = String::new();
        let _ = writeln!(out, "{}", cells(self.header.as_deref().unwrap_or(&[])));
        let rule: String = (0..columns)
            .map(|c| match self.align_of(c) {
                Align::Left => "---|",
                Align::Right => "---:|",
            })
            .collect();
        let _ = writeln!(out, "|{rule}");
        for line in &self.lines {
            match line {
                Line::Row(row) => {
                    let _ = writeln!(out, "{}", cells(row));
                }
                Line::Note(note) => {
                    let _ = writeln!(out, "{note}");
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_aligns_columns_under_an_underlined_header() {
        let mut t = Table::new(&["name", "n", "note"]).left(1);
        t.row(["a", "1", "x"]);
        t.row(["long name", "100"]);
        t.note("  a free line");
        t.row(vec![String::from("é"), String::from("2"), String::from("")]);
        assert_eq!(
            t.text(),
            "name         n  note\n\
             --------------------\n\
             a            1     x\n\
             long name  100\n  a free line\n\
             é            2\n"
        );
    }

    #[test]
    fn a_headless_table_has_rows_only_and_may_be_indented() {
        let mut t = Table::headless()
            .indent(2)
            .aligns(&[Align::Left, Align::Right, Align::Left]);
        t.row(["p90", "1.5", "met"]);
        t.row(["hit ratio", "-0.25", "NOT MET"]);
        assert_eq!(
            t.text(),
            "  p90          1.5  met\n  hit ratio  -0.25  NOT MET\n"
        );
        assert_eq!(Table::headless().text(), "");
    }

    #[test]
    fn markdown_has_a_cell_per_column_and_marks_right_aligned_ones() {
        let mut t = Table::new(&["case", "n"]).left(1);
        t.row(["a|b", "1"]);
        t.row(["c"]);
        assert_eq!(
            t.markdown(),
            "| case | n |\n|---|---:|\n| a\\|b | 1 |\n| c |  |\n"
        );
        let mut all_left = Table::new(&["case", "outcome"]).left(2);
        all_left.row(["x", "200"]);
        assert_eq!(
            all_left.markdown(),
            "| case | outcome |\n|---|---|\n| x | 200 |\n"
        );
    }
}
