//! Rounds, medians and per-round ratios: each round runs every selected workload with every
//! selected library, one library after the other, their order rotated by one each round
//! ([`rotated`]) so that no library always goes first. A figure is reported as the median
//! over the rounds ([`medians`], [`print_medians`]: with its ratio to the floor's median), and
//! round by round divided by each baseline library's figure of the same round, with the
//! median of those ratios ([`round_ratios`], [`print_round_ratios`]): a ratio within one
//! round cancels what drifts between rounds (the machine's other work). Also the knobs every
//! bench reads (`BENCH_RUNS`, `BENCH_SCALE`, the `BENCH_*` lists) and the JSON lines appended
//! to `target/bench.jsonl` ([`write_jsonl`]). A bench names its measurements by a [`Measured`]
//! key of its own. Neighbours: `header.rs` (the run's first JSON line).

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::io::Write;
use std::time::Duration;

use super::header::Header;

/// One measurement's figures, by metric (`cycles_per_s`, `p50_ms`, …).
pub type Row<M> = BTreeMap<M, f64>;

/// One row per round, in round order, by measurement.
pub type Results<K, M> = BTreeMap<K, Vec<Row<M>>>;

/// What names a measurement: a deployment, a workload, a library. Keys sort by deployment,
/// then workload, then library.
pub trait Measured: Ord + Clone {
    fn deployment(&self) -> &str;
    fn workload(&self) -> &str;
    fn library(&self) -> &str;
    /// The same deployment and workload, measured with `library`.
    fn with_library(&self, library: &'static str) -> Self;
    /// How the tables of medians name it (`single  W1 distlock   `).
    fn label(&self) -> String;
}

/// The rounds to run: `BENCH_RUNS`, default 5.
pub fn runs() -> usize {
    std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|runs| runs.parse().ok())
        .unwrap_or(5)
}

/// What the workloads' counts are multiplied by: `BENCH_SCALE`, default 1.
pub fn scale() -> f64 {
    std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|scale| scale.parse().ok())
        .unwrap_or(1.0)
}

/// `count` scaled by `scale`, at least 1.
pub fn scaled(count: usize, scale: f64) -> usize {
    ((count as f64 * scale).round() as usize).max(1)
}

/// Whether `name` is in the comma-separated list `var`, or `var` is unset (then `default`).
pub fn selected(var: &str, name: &str, default: bool) -> bool {
    std::env::var(var).map_or(default, |list| {
        list.split(',').any(|item| item.trim() == name)
    })
}

/// `items` in round `round`'s order: rotated left by one per round.
pub fn rotated<T>(items: &[T], round: usize) -> Vec<&T> {
    let mut order: Vec<&T> = items.iter().collect();
    order.rotate_left(round % items.len().max(1));
    order
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// The `q` quantile of `samples`, in milliseconds (0 for none).
pub fn pct(samples: &mut [Duration], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort();
    samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3
}

/// The median over the rounds of every metric of the first round's row.
pub fn medians<K, M>(results: &Results<K, M>) -> BTreeMap<K, Row<M>>
where
    K: Measured,
    M: Ord + Clone + Borrow<str>,
{
    results
        .iter()
        .map(|(key, rows)| {
            let mut row = Row::new();
            for metric in rows[0].keys() {
                let name: &str = metric.borrow();
                let mut values: Vec<f64> =
                    rows.iter().filter_map(|r| r.get(name)).copied().collect();
                row.insert(metric.clone(), median(&mut values));
            }
            (key.clone(), row)
        })
        .collect()
}

/// Every median, a line per measurement, with its ratio to `floor`'s median in brackets.
pub fn print_medians<K, M>(medians: &BTreeMap<K, Row<M>>, runs: usize, floor: &'static str)
where
    K: Measured,
    M: Ord + Borrow<str> + Display,
{
    println!("\nmedians of {runs} alternating rounds (ratio to the {floor} floor in brackets)\n");
    for (key, row) in medians {
        let base = medians.get(&key.with_library(floor));
        let cells: Vec<String> = row
            .iter()
            .map(
                |(metric, value)| match base.and_then(|f| f.get(metric.borrow())) {
                    Some(base) if *base != 0.0 && key.library() != floor => {
                        format!("{metric}={value:.3} [{:.2}x]", value / base)
                    }
                    _ => format!("{metric}={value:.3}"),
                },
            )
            .collect();
        println!("{} {}", key.label(), cells.join("  "));
    }
}

/// `key`'s `metric` over `baseline`'s, round by round (`None` where either is missing or the
/// baseline's is zero), or `None` if the baseline is `key`'s own library or did not run.
pub fn round_ratios<K, M>(
    results: &Results<K, M>,
    key: &K,
    baseline: &'static str,
    metric: &str,
) -> Option<Vec<Option<f64>>>
where
    K: Measured,
    M: Ord + Borrow<str>,
{
    if key.library() == baseline {
        return None;
    }
    let base = results.get(&key.with_library(baseline))?;
    let ratios = results[key]
        .iter()
        .zip(base)
        .map(|(row, base)| {
            let (value, base) = (row.get(metric)?, base.get(metric)?);
            (*base != 0.0).then(|| value / base)
        })
        .collect();
    Some(ratios)
}

/// The median of the ratios there are.
pub fn ratio_median(ratios: &[Option<f64>]) -> Option<f64> {
    let mut values: Vec<f64> = ratios.iter().flatten().copied().collect();
    (!values.is_empty()).then(|| median(&mut values))
}

/// A figure for the tables: whole numbers with thousands separators from 100 up (and whole
/// counts), three decimals below.
pub fn figure(value: f64) -> String {
    if value.abs() < 100.0 && value.fract() != 0.0 {
        return format!("{value:.3}");
    }
    let digits = format!("{:.0}", value.abs());
    let mut grouped = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    if value < 0.0 {
        grouped.insert(0, '-');
    }
    grouped
}

/// Two decimals; four below 0.1 (W4's requests), so that no ratio shows as zero.
fn shown_ratio(ratio: f64) -> String {
    if ratio.abs() < 0.1 {
        format!("{ratio:.4}")
    } else {
        format!("{ratio:.2}")
    }
}

/// `vs raw: 0.41 0.40 - (median 0.41)`, or nothing when there is no such comparison.
fn ratio_cell(baseline: &str, ratios: Option<Vec<Option<f64>>>) -> String {
    let Some(ratios) = ratios else {
        return String::new();
    };
    let rounds: Vec<String> = ratios
        .iter()
        .map(|ratio| ratio.map_or("-".to_owned(), shown_ratio))
        .collect();
    let median = ratio_median(&ratios).map_or("-".to_owned(), shown_ratio);
    format!("vs {baseline}: {} (median {median})", rounds.join(" "))
}

/// Prints rows of cells, each column as wide as its widest cell.
fn print_aligned(rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            let width = |row: &Vec<String>| row.get(c).map_or(0, |cell| cell.chars().count());
            rows.iter().map(width).max().unwrap_or(0)
        })
        .collect();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, &width)| format!("{cell:<width$}"))
            .collect();
        println!("  {}", cells.join(" | ").trim_end_matches([' ', '|']));
    }
}

/// `raw's and rslock's`.
fn possessives(baselines: &[&str]) -> String {
    let names: Vec<String> = baselines.iter().map(|name| format!("{name}'s")).collect();
    names.join(" and ")
}

/// Per deployment, workload and main figure (`main_metrics`): each library's figure round by
/// round and its ratios to the `baselines`' of the same round, aligned.
pub fn print_round_ratios<K, M>(
    results: &Results<K, M>,
    baselines: &[&'static str],
    main_metrics: fn(&str) -> &'static [&'static str],
) where
    K: Measured,
    M: Ord + Borrow<str>,
{
    println!(
        "\nper round: each library's figure, then its ratio to {} of the same round",
        possessives(baselines)
    );
    // The keys of each (deployment, workload), in the keys' order.
    let mut groups: Vec<Vec<&K>> = Vec::new();
    for key in results.keys() {
        match groups.last_mut() {
            Some(group)
                if group[0].deployment() == key.deployment()
                    && group[0].workload() == key.workload() =>
            {
                group.push(key)
            }
            _ => groups.push(vec![key]),
        }
    }
    for keys in groups {
        let (deployment, workload) = (keys[0].deployment(), keys[0].workload());
        for metric in main_metrics(workload) {
            println!("\n{deployment} {workload} {metric}");
            let values = |key: &K| -> Vec<String> {
                let value = |row: &Row<M>| row.get(*metric).map_or("-".to_owned(), |v| figure(*v));
                results[key].iter().map(value).collect()
            };
            let width = keys.iter().flat_map(|key| values(key)).map(|v| v.len());
            let width = width.max().unwrap_or(0);
            let rows: Vec<Vec<String>> = keys
                .iter()
                .map(|key| {
                    let values: Vec<String> =
                        values(key).iter().map(|v| format!("{v:>width$}")).collect();
                    let mut cells = vec![format!("{:<11} {}", key.library(), values.join(" "))];
                    for baseline in baselines {
                        cells.push(ratio_cell(
                            baseline,
                            round_ratios(results, *key, baseline, metric),
                        ));
                    }
                    cells
                })
                .collect();
            print_aligned(&rows);
        }
    }
}

/// The JSON line of one measurement: its medians, then the medians of its per-round ratios to
/// the baselines (`<metric>_vs_<baseline>`).
fn result_line<K, M>(
    results: &Results<K, M>,
    key: &K,
    medians: &Row<M>,
    runs: usize,
    baselines: &[&'static str],
    main_metrics: fn(&str) -> &'static [&'static str],
) -> String
where
    K: Measured,
    M: Ord + Borrow<str> + Display,
{
    let mut fields: Vec<String> = medians
        .iter()
        .map(|(k, v)| format!("\"{k}\": {v:.4}"))
        .collect();
    for metric in main_metrics(key.workload()) {
        for baseline in baselines {
            let ratios = round_ratios(results, key, baseline, metric);
            if let Some(median) = ratios.as_deref().and_then(ratio_median) {
                fields.push(format!("\"{metric}_vs_{baseline}\": {median:.4}"));
            }
        }
    }
    format!(
        "{{\"deployment\": \"{}\", \"workload\": \"{}\", \"library\": \"{}\", \"runs\": {runs}, {}}}",
        key.deployment(),
        key.workload(),
        key.library(),
        fields.join(", ")
    )
}

/// Appends the header and a line per measurement to `target/bench.jsonl`.
pub fn write_jsonl<K, M>(
    header: &Header,
    results: &Results<K, M>,
    medians: &BTreeMap<K, Row<M>>,
    runs: usize,
    baselines: &[&'static str],
    main_metrics: fn(&str) -> &'static [&'static str],
) where
    K: Measured,
    M: Ord + Borrow<str> + Display,
{
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench.jsonl");
    let _ = std::fs::create_dir_all(path.parent().expect("a parent"));
    let mut jsonl = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open target/bench.jsonl");
    let _ = writeln!(jsonl, "{}", header.json());
    for (key, row) in medians {
        let line = result_line(results, key, row, runs, baselines, main_metrics);
        let _ = writeln!(jsonl, "{line}");
    }
}
