//! The report's one self-contained page, `index.html`: tables.md rendered to HTML
//! (pulldown-cmark, tables on), every plot inline where tables.md references it (the SVG's
//! markup, else the PNG as a base64 data URI), then the derived Markdown files and their
//! figures. No script and nothing loaded from elsewhere, so the page is one file to open or
//! send. Reads the plots just written; O(bytes of the report).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};

use super::derived::{bpt_md, decode_md, prefill_md, tree_vs_ring};
use crate::error::{Error, Result};

/// The page's name in the report directory.
pub const HTML_NAME: &str = "index.html";

/// The derived Markdown files in the page's order, each with the figure shown after it.
const DERIVED: [(&str, Option<&str>); 4] = [
    (decode_md::MARKDOWN, Some(decode_md::PAGING_PLOT)),
    (prefill_md::MARKDOWN, Some(prefill_md::PLOT)),
    (bpt_md::MARKDOWN, None),
    (tree_vs_ring::MARKDOWN, Some(tree_vs_ring::PLOT)),
];

/// Readable tables that scroll sideways rather than squeeze; plots scaled to the page.
const STYLE: &str = "\
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;line-height:1.45;color:#1a1a1a;\
max-width:1440px;margin:1.5em auto;padding:0 1em}
h1,h2,h3{line-height:1.2}
table{border-collapse:collapse;margin:1em 0;font-size:0.88em;display:block;overflow-x:auto}
th,td{border:1px solid #c8c8c8;padding:0.25em 0.6em;white-space:nowrap}
th{background:#eef1f5}
tbody tr:nth-child(even){background:#f7f8fa}
code{background:#f1f1f1;padding:0 0.2em;border-radius:3px}
.plot{display:block;margin:1em 0}
.plot svg,.plot img{max-width:100%;height:auto;border:1px solid #e2e2e2}
hr{margin:2.5em 0}
";

/// What the page is made of.
pub struct Sources<'a> {
    /// The report directory: the plots tables.md references are there, the page goes there.
    pub out: &'a Path,
    /// tables.md as written.
    pub tables_md: &'a str,
    /// The plot files written into `out`, by name (`runtime.png`, `runtime.svg`, ...).
    pub plots: &'a [String],
    /// The derived files written, by path (`decode.md`, `paging.svg`, ...).
    pub derived: &'a [PathBuf],
}

/// Renders the page and writes it as `out/index.html` (beside its name, then renamed into
/// place); returns its path.
pub fn write(s: &Sources) -> Result<PathBuf> {
    let page = render(s)?;
    let path = s.out.join(HTML_NAME);
    crate::results::durable::write_atomic(&path, page.as_bytes())?;
    Ok(path)
}

/// The page's markup.
pub fn render(s: &Sources) -> Result<String> {
    let plots = Plots {
        dir: s.out,
        files: s.plots.iter().map(String::as_str).collect(),
    };
    let mut placed = BTreeSet::new();
    let mut body = markdown(s.tables_md, &plots, &mut placed)?;
    // A plot tables.md does not reference still belongs on the page.
    let mut rest = Vec::new();
    for stem in s.plots.iter().map(|f| stem_of(f)) {
        if !placed.contains(&s.out.join(stem)) && !rest.contains(&stem) {
            rest.push(stem);
        }
    }
    if !rest.is_empty() {
        body += "<h2>Other plots</h2>\n";
        for stem in rest {
            body += &plots.inline(stem, stem)?;
        }
    }
    for (md, figure) in DERIVED {
        let find = |name: &str| {
            s.derived
                .iter()
                .find(|p| p.file_name() == Some(name.as_ref()))
        };
        let md_path = find(md);
        let fig_path = figure.and_then(find);
        if md_path.is_none() && fig_path.is_none() {
            continue;
        }
        body += "<hr>\n<section>\n";
        let mut placed = BTreeSet::new();
        if let Some(path) = md_path {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
            let dir = path.parent().unwrap_or(Path::new("."));
            let names: Vec<&str> = fig_path
                .and_then(|p| p.file_name()?.to_str())
                .into_iter()
                .collect();
            let local = Plots { dir, files: names };
            body += &markdown(&text, &local, &mut placed)?;
        }
        if let Some(path) = fig_path {
            let stem = path.with_extension("");
            if !placed.contains(&stem) {
                let name = stem.file_name().and_then(|n| n.to_str()).unwrap_or(md);
                let svg = read_svg(path)?;
                body += &format!(
                    "<span class=\"plot\" role=\"img\" aria-label=\"{}\">{svg}</span>\n",
                    escape(name)
                );
            }
        }
        body += "</section>\n";
    }
    let title = title_of(s.tables_md).unwrap_or_else(|| "attnbench report".into());
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n",
        escape(&title)
    ))
}

/// The plot files of one directory the page may inline.
struct Plots<'a> {
    dir: &'a Path,
    files: Vec<&'a str>,
}

impl Plots<'_> {
    /// The stem of the plot `dest` names: one of the files by name, nothing else (no URL,
    /// no other directory), so the page only ever inlines what the report wrote.
    fn stem_for<'d>(&self, dest: &'d str) -> Option<&'d str> {
        self.files.contains(&dest).then(|| stem_of(dest))
    }

    /// The plot `stem` inline: the SVG's markup where one was written (it scales and its
    /// text stays text), else the PNG as a data URI.
    fn inline(&self, stem: &str, alt: &str) -> Result<String> {
        let (svg, png) = (format!("{stem}.svg"), format!("{stem}.png"));
        let alt = escape(alt);
        if self.files.contains(&svg.as_str()) {
            let markup = read_svg(&self.dir.join(&svg))?;
            Ok(format!(
                "<span class=\"plot\" role=\"img\" aria-label=\"{alt}\">{markup}</span>\n"
            ))
        } else if self.files.contains(&png.as_str()) {
            let path = self.dir.join(&png);
            let bytes = std::fs::read(&path)
                .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
            let data = base64::engine::general_purpose::STANDARD.encode(bytes);
            Ok(format!(
                "<span class=\"plot\"><img alt=\"{alt}\" src=\"data:image/png;base64,{data}\"></span>\n"
            ))
        } else {
            Ok(format!("<em>{alt}</em>"))
        }
    }
}

/// `text` rendered, its images and links to plots of `plots` replaced by the plots inline
/// (their stems, joined to the directory, added to `placed`). Any other image becomes its
/// alt text: the page loads nothing from outside itself.
fn markdown(text: &str, plots: &Plots, placed: &mut BTreeSet<PathBuf>) -> Result<String> {
    let events: Vec<Event> = Parser::new_ext(text, Options::ENABLE_TABLES).collect();
    let mut kept = Vec::with_capacity(events.len());
    let mut i = 0;
    while i < events.len() {
        let (dest, is_image) = match &events[i] {
            Event::Start(Tag::Image { dest_url, .. }) => (dest_url.as_ref(), true),
            Event::Start(Tag::Link { dest_url, .. }) => (dest_url.as_ref(), false),
            _ => {
                kept.push(events[i].clone());
                i += 1;
                continue;
            }
        };
        let end = closing(&events, i);
        let stem = plots.stem_for(dest);
        if stem.is_none() && !is_image {
            kept.push(events[i].clone());
            i += 1;
            continue;
        }
        let alt = plain_text(&events[i + 1..end]);
        let html = match stem {
            Some(stem) => {
                placed.insert(plots.dir.join(stem));
                plots.inline(stem, &alt)?
            }
            None => format!("<em>{}</em>", escape(&alt)),
        };
        kept.push(Event::InlineHtml(html.into()));
        i = end + 1;
    }
    let mut out = String::with_capacity(text.len() * 2);
    pulldown_cmark::html::push_html(&mut out, kept.into_iter());
    Ok(out)
}

/// The index of the event closing the tag opened at `start`.
fn closing(events: &[Event], start: usize) -> usize {
    let mut depth = 0usize;
    for (j, e) in events.iter().enumerate().skip(start) {
        match e {
            Event::Start(_) => depth += 1,
            Event::End(_) => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    events.len() - 1
}

/// The text of `events`, markup dropped.
fn plain_text(events: &[Event]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Text(t) | Event::Code(t) => Some(t.as_ref()),
            Event::SoftBreak | Event::HardBreak => Some(" "),
            _ => None,
        })
        .collect()
}

/// The text of the first level-1 heading of `md`.
fn title_of(md: &str) -> Option<String> {
    let events: Vec<Event> = Parser::new_ext(md, Options::ENABLE_TABLES).collect();
    let start = events.iter().position(|e| {
        matches!(
            e,
            Event::Start(Tag::Heading {
                level: HeadingLevel::H1,
                ..
            })
        )
    })?;
    let end = events[start..]
        .iter()
        .position(|e| matches!(e, Event::End(TagEnd::Heading(_))))?;
    Some(plain_text(&events[start + 1..start + end]))
}

/// The SVG file's markup from its `<svg` on (no XML prolog or doctype, which have no place
/// inside an HTML page).
fn read_svg(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    match text.find("<svg") {
        Some(at) => Ok(text[at..].trim_end().to_string()),
        None => Err(Error::Runtime(format!(
            "{}: not an SVG (no <svg element)",
            path.display()
        ))),
    }
}

/// `name` without its extension.
fn stem_of(name: &str) -> &str {
    name.rsplit_once('.').map_or(name, |(s, _)| s)
}

/// `s` safe in HTML text and in a quoted attribute.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources<'a>(out: &'a Path, md: &'a str, plots: &'a [String]) -> Sources<'a> {
        Sources {
            out,
            tables_md: md,
            plots,
            derived: &[],
        }
    }

    #[test]
    fn plots_are_inlined_where_referenced_and_other_images_load_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let svg =
            "<svg width=\"10\" height=\"10\" xmlns=\"http://www.w3.org/2000/svg\"><rect/></svg>";
        std::fs::write(
            dir.path().join("a.svg"),
            format!("<?xml version=\"1.0\"?>\n{svg}\n"),
        )
        .unwrap();
        std::fs::write(dir.path().join("b.png"), b"\x89PNG-bytes").unwrap();
        let plots = ["a.png".to_string(), "a.svg".into(), "b.png".into()];
        let md = "# R & D\n\n| x | y |\n|---|--:|\n| 1 | 2 |\n\n![A plot](a.png)\n\n\
                  [the B plot](b.png)\n\n![far](https://example.com/x.png)\n";
        let page = render(&sources(dir.path(), md, &plots)).unwrap();
        assert!(page.contains("<title>R &amp; D</title>"), "{page}");
        assert!(
            page.contains("<table>") && page.contains("<td style=\"text-align: right\">2</td>")
        );
        // The SVG's markup, prolog dropped, once.
        assert_eq!(page.matches(svg).count(), 1, "{page}");
        assert!(!page.contains("<?xml"));
        assert!(page.contains("aria-label=\"A plot\""));
        // The PNG without an SVG as a data URI, in place of the link.
        let data = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG-bytes");
        assert!(page.contains(&format!(
            "alt=\"the B plot\" src=\"data:image/png;base64,{data}\""
        )));
        assert!(!page.contains("href=\"b.png\""));
        // The remote image is its alt text only.
        assert!(!page.contains("example.com") && page.contains("<em>far</em>"));
        assert!(!page.contains("Other plots"));
    }

    #[test]
    fn a_plot_tables_md_does_not_reference_is_still_shown() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("c.svg"), "<svg><g/></svg>").unwrap();
        let plots = ["c.svg".to_string()];
        let page = render(&sources(dir.path(), "no plots here\n", &plots)).unwrap();
        assert!(page.contains("<h2>Other plots</h2>") && page.contains("<svg><g/></svg>"));
        assert!(page.contains("<title>attnbench report</title>"));
    }

    #[test]
    fn derived_files_follow_with_their_figures() {
        let dir = tempfile::tempdir().unwrap();
        let (md, fig) = (dir.path().join("decode.md"), dir.path().join("paging.svg"));
        std::fs::write(&md, "# Decode\n\n| a |\n|---|\n| 1 |\n").unwrap();
        std::fs::write(&fig, "<svg id=\"paging\"></svg>").unwrap();
        let bpt = dir.path().join("bpt.md");
        std::fs::write(&bpt, "# BPT\n").unwrap();
        // Written in this order by the derived module: the figure before its Markdown.
        let derived = [fig, md, bpt];
        let s = Sources {
            derived: &derived,
            ..sources(dir.path(), "# Top\n", &[])
        };
        let page = render(&s).unwrap();
        let at = |needle: &str| {
            page.find(needle)
                .unwrap_or_else(|| panic!("{needle}: {page}"))
        };
        assert!(at("<h1>Top</h1>") < at("<h1>Decode</h1>"));
        assert!(at("<h1>Decode</h1>") < at("<svg id=\"paging\">"));
        assert!(at("<svg id=\"paging\">") < at("<h1>BPT</h1>"));
        assert_eq!(page.matches("<table>").count(), 1);
    }

    #[test]
    fn a_file_that_is_no_svg_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("d.svg"), "not svg").unwrap();
        let plots = ["d.svg".to_string()];
        let e = render(&sources(dir.path(), "![d](d.svg)\n", &plots)).unwrap_err();
        assert!(e.to_string().contains("d.svg"), "{e}");
    }
}
