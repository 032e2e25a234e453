//! A `tracing` layer that keeps every closed span and every event (with its fields and the
//! span it happened in), so a test can read what distlock told the outside. Installed as the
//! global default once per test binary: distlock emits from its own I/O thread too, where a
//! thread-local default would see nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record as SpanRecord};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A closed span or an event.
#[derive(Debug, Clone)]
pub struct Record {
    /// `"span"` or `"event"`.
    pub kind: &'static str,
    /// The span's name, or the event's message.
    pub name: String,
    pub target: String,
    pub level: Level,
    pub fields: BTreeMap<String, String>,
    /// For an event: the span it happened in (name and fields).
    pub parent: Option<(String, BTreeMap<String, String>)>,
}

impl Record {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    /// The record's own field `name`, or its parent span's.
    pub fn field_or_parent(&self, name: &str) -> Option<&str> {
        self.field(name).or_else(|| {
            self.parent
                .as_ref()
                .and_then(|(_, fields)| fields.get(name).map(String::as_str))
        })
    }
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<Record>>>);

impl Captured {
    /// Every record so far.
    pub fn records(&self) -> Vec<Record> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The records whose own or parent field `key` is `value` (picked before they are copied:
    /// the capture holds what every test of the binary logged).
    pub fn about(&self, key: &str, value: &str) -> Vec<Record> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|record| record.field_or_parent(key) == Some(value))
            .cloned()
            .collect()
    }
}

struct CaptureLayer(Captured);

impl<S> Layer<S> for CaptureLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &SpanRecord<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(fields);
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let name = fields.0.remove("message").unwrap_or_default();
        let parent = ctx.event_span(event).map(|span| {
            let fields = span
                .extensions()
                .get::<Fields>()
                .map(|fields| fields.0.clone())
                .unwrap_or_default();
            (span.name().to_owned(), fields)
        });
        let metadata = event.metadata();
        self.0
             .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Record {
                kind: "event",
                name,
                target: metadata.target().to_owned(),
                level: *metadata.level(),
                fields: fields.0,
                parent,
            });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let fields = span
            .extensions()
            .get::<Fields>()
            .map(|fields| fields.0.clone())
            .unwrap_or_default();
        let metadata = span.metadata();
        self.0
             .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Record {
                kind: "span",
                name: span.name().to_owned(),
                target: metadata.target().to_owned(),
                level: *metadata.level(),
                fields,
                parent: None,
            });
    }
}

/// Installs the capturing layer as the global default (once per binary) and returns it.
pub fn install() -> Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured = Captured::default();
            let subscriber = tracing_subscriber::registry().with(CaptureLayer(captured.clone()));
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in this test binary");
            captured
        })
        .clone()
}
