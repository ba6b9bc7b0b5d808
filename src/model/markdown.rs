//! Plain Markdown tables and number formatting for the model's result files. O(cells).

/// A GitHub-flavoured Markdown table.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n", header.join(" | "));
    s += &format!("|{}\n", "---|".repeat(header.len()));
    for r in rows {
        s += &format!("| {} |\n", r.join(" | "));
    }
    s
}

/// Seconds with a unit: "1.23 ms".
pub fn seconds(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let a = x.abs();
    if a >= 1.0 {
        format!("{x:.3} s")
    } else if a >= 1e-3 {
        format!("{:.3} ms", x * 1e3)
    } else {
        format!("{:.1} µs", x * 1e6)
    }
}

/// A count with thousands separators: 655,364,096.
pub fn count(x: u64) -> String {
    let digits = x.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Tokens as the paper writes them: 80k, 5.12M.
pub fn tokens(n: usize) -> String {
    if n >= 1_000_000 && n.is_multiple_of(10_000) {
        format!("{}M", n as f64 / 1e6)
    } else if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(count(655_364_096), "655,364,096");
        assert_eq!(count(12), "12");
        assert_eq!(tokens(80_000), "80k");
        assert_eq!(tokens(5_120_000), "5.12M");
        assert_eq!(seconds(0.00123), "1.230 ms");
        assert!(table(&["a", "b"], &[vec!["1".into(), "2".into()]]).contains("| 1 | 2 |"));
    }
}
