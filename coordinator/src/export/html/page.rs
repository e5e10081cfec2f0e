//! The page around report.html's sections: style, the table sorter, tables and figures.

use crate::export::html::esc;

const STYLE: &str = r#"
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1100px;padding:0 16px 40px;color:#222}
h1{font-size:1.5em;margin:20px 0 4px} h2{font-size:1.2em;margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;margin:0 0 12px} .verdict{background:#fff4e5;border-left:4px solid #d65;padding:8px 12px;white-space:pre-wrap;font-size:.9em}
.ok{color:#17702a;font-weight:600} .fail{color:#b00020;font-weight:600} .nodata{color:#888}
table{border-collapse:collapse;font-size:.85em;margin:8px 0} th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th{background:#f6f6f6;position:sticky;top:0} td:first-child,th:first-child{text-align:left} .txt{text-align:left}
table.sortable th{cursor:pointer} table.sortable th:after{content:" \2195";color:#aaa}
figure{margin:8px 0} figcaption{font-size:.85em;color:#555} .scroll{max-height:520px;overflow:auto}
.heat{display:flex;gap:8px} .heat img{image-rendering:pixelated;flex:1;min-width:0;border:1px solid #ccc}
.heat .labels{font-size:11px;line-height:var(--row);white-space:nowrap;text-align:right}
.legend span{display:inline-block;width:28px;height:10px;margin-left:6px;vertical-align:middle}
"#;

/// Click a header to sort by it; cells carry their sort key in `data-v` (numbers sort as
/// numbers, so "2.1 ms" sorts below "10 ms"). A table it is ready on says so
/// (`data-sorter="ready"`), which the browser test reads back from the DOM.
const SORTER: &str = r#"
document.querySelectorAll("table.sortable").forEach(function(t){
  t.dataset.sorter="ready";
  t.querySelectorAll("th").forEach(function(th,i){
    th.addEventListener("click",function(){
      var b=t.tBodies[0],rows=Array.prototype.slice.call(b.rows),asc=th.dataset.asc!=="1";
      t.querySelectorAll("th").forEach(function(h){delete h.dataset.asc});
      if(asc)th.dataset.asc="1";
      function key(r){var c=r.cells[i],v=c.dataset.v!==undefined?c.dataset.v:c.textContent,n=parseFloat(v);return isNaN(n)?v:n}
      rows.sort(function(x,y){var a=key(x),c=key(y),o=(typeof a==="number"&&typeof c==="number")?a-c:String(a).localeCompare(String(c));return asc?o:-o});
      rows.forEach(function(r){b.appendChild(r)});
    });
  });
});
"#;

/// HTML-escapes a string.
pub fn esc_str(s: &str) -> String {
    esc(&s)
}

/// The complete HTML document.
pub fn document(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head>\n<body>\n{body}\n<script>{SORTER}</script>\n</body></html>\n",
        esc(&title)
    )
}

/// A table cell: what it shows, and the value it sorts by when that differs.
pub struct Cell {
    pub text: String,
    pub sort: Option<f64>,
    pub class: &'static str,
}

impl Cell {
    pub fn text(s: impl std::fmt::Display) -> Cell {
        Cell {
            text: esc(&s),
            sort: None,
            class: "txt",
        }
    }
    pub fn num(shown: impl std::fmt::Display, value: f64) -> Cell {
        Cell {
            text: esc(&shown),
            sort: Some(value),
            class: "",
        }
    }
    /// Already-escaped HTML.
    pub fn html(html: String) -> Cell {
        Cell {
            text: html,
            sort: None,
            class: "txt",
        }
    }
}

/// A sortable table with the given id.
pub fn table(id: &str, headers: &[&str], rows: Vec<Vec<Cell>>) -> String {
    let mut s = format!("<div class=\"scroll\"><table class=\"sortable\" id=\"{id}\"><thead><tr>");
    for h in headers {
        s.push_str(&format!("<th>{}</th>", esc(h)));
    }
    s.push_str("</tr></thead><tbody>\n");
    for row in rows {
        s.push_str("<tr>");
        for c in row {
            let v = c
                .sort
                .filter(|v| v.is_finite())
                .map(|v| format!(" data-v=\"{v}\""))
                .unwrap_or_default();
            let class = if c.class.is_empty() {
                String::new()
            } else {
                format!(" class=\"{}\"", c.class)
            };
            s.push_str(&format!("<td{class}{v}>{}</td>", c.text));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table></div>\n");
    s
}

/// A chart in a figure the tests (and readers) find by id, with its series names listed.
pub fn figure(id: &str, series: &[&str], svg: &str, caption: &str) -> String {
    format!(
        "<figure class=\"chart\" id=\"{id}\" data-series=\"{}\">{svg}<figcaption>{}</figcaption></figure>\n",
        esc(&series.join(",")),
        esc(&caption)
    )
}

/// Latency in µs, in the unit that reads best.
pub fn lat_us(us: f64) -> String {
    if !us.is_finite() {
        "-".into()
    } else if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_escape_and_carry_sort_keys() {
        let t = table(
            "t",
            &["name", "p99"],
            vec![vec![Cell::text("<a&b>"), Cell::num(lat_us(2100.0), 2100.0)]],
        );
        assert!(t.contains("&lt;a&amp;b&gt;"));
        assert!(t.contains("data-v=\"2100\">2.10 ms<"));
        assert_eq!(lat_us(12.4), "12 µs");
        assert_eq!(lat_us(3_200_000.0), "3.20 s");
    }
}
