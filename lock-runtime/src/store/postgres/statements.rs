//! The PostgreSQL store's statements. An operation is one transaction of three: [`turns`]
//! takes the keys' turns (advisory locks held to the end of the transaction, so operations on
//! a key run one after another), [`read`] reads their rows with the database's clock
//! (`clock_timestamp()`, never the transaction's start), and [`write`] writes back the rows the
//! twin changed, each only if its version is still the one read (a safety net: a sweep does
//! not take turns; all or none, a key changed aborts the statement with `DL001` and the store
//! reads again), takes the fencing tokens the twin asked for from the sequence after the rows
//! are written — so the next grant of a key, whose turn comes after this transaction
//! commits, takes a greater token — and notifies the waiters at commit. A fenced transaction
//! (`fenced_postgres.rs`) takes the same turns shared ([`shared_turns`]) and reads whether a
//! grant still holds its key ([`holders`]). Neighbours: `postgres.rs` runs them through
//! `connections.rs`; `schema.rs` makes what they use.

/// Takes the turns of the keys `$1` (`text[]`) for the rest of the transaction: an advisory
/// lock each (`pg_advisory_xact_lock`, of the two-key space, the schema's hash first), in one
/// order, so that two operations on common keys never wait on each other in a circle. The
/// read that follows runs on a snapshot taken once they are held. (Two keys of one hash share
/// a turn: harmless.)
pub(crate) fn turns(schema: &str) -> String {
    format!(
        "SELECT count(pg_advisory_xact_lock(hashtext('{schema}'), h)) \
         FROM (SELECT DISTINCT hashtext(n) AS h FROM unnest($1::text[]) AS n ORDER BY 1) AS keys"
    )
}

/// Takes the turns of the keys `$1` (`text[]`) in shared mode for the rest of the transaction,
/// in [`turns`]' order: a fenced transaction's (`fenced_postgres.rs`). The store's own
/// operations take the turns exclusively, so none of them — a try, a renewal, a release, an
/// expiry judged, a forced unlock — commits a change of those keys while it is open; fenced
/// transactions of one key run side by side.
pub(crate) fn shared_turns(schema: &str) -> String {
    format!(
        "SELECT count(pg_advisory_xact_lock_shared(hashtext('{schema}'), h)) \
         FROM (SELECT DISTINCT hashtext(n) AS h FROM unnest($1::text[]) AS n ORDER BY 1) AS keys"
    )
}

/// For each grant of `$1` (lock keys), `$2` (owner tokens) and `$3` (what it holds: `w` the
/// write side, `r` a read grant, `p` a permit), in their order and read in the layout of
/// `store/key_state.rs`: the key, whether the grant holds it still on the database's clock (its entry is
/// there and ends after `clock_timestamp()`), whether another grant does, and the highest
/// token the sequence has handed out (null: none yet).
pub(crate) fn holders(schema: &str) -> String {
    format!(
        "SELECT k.name, \
                coalesce(CASE k.part \
                    WHEN 'w' THEN l.state->'w'->>0 = k.owner \
                        AND (l.state->'w'->>1)::bigint > clock.us \
                    WHEN 'r' THEN (l.state->'r'->>k.owner)::bigint > clock.us \
                    WHEN 'p' THEN (l.state->'p'->'h'->>k.owner)::bigint > clock.us \
                END, false), \
                coalesce(l.state->'w'->>0 <> k.owner AND (l.state->'w'->>1)::bigint > clock.us, \
                    false) \
                OR EXISTS (SELECT 1 FROM jsonb_each_text(coalesce(l.state->'r', '{{}}'::jsonb) \
                        || coalesce(l.state->'p'->'h', '{{}}'::jsonb)) AS h(owner, until) \
                    WHERE h.owner <> k.owner AND h.until::bigint > clock.us), \
                (SELECT CASE WHEN is_called THEN last_value END FROM {schema}.tokens) \
         FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY \
             AS k(name, owner, part, position) \
         CROSS JOIN (SELECT extract(epoch FROM clock_timestamp()) * 1e6 AS us) AS clock \
         LEFT JOIN {schema}.locks AS l ON l.name = k.name \
         ORDER BY k.position"
    )
}

/// Reads the rows of the keys `$1` (`text[]`): one row with the database's clock
/// (microseconds since the epoch) and the highest token handed out, and for each key that has
/// a row its name, version and state (none: `name` is null).
pub(crate) fn read(schema: &str) -> String {
    format!(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, \
                (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {schema}.tokens), \
                l.name, l.version, l.state \
         FROM (SELECT 1) AS one LEFT JOIN {schema}.locks l ON l.name = ANY($1::text[])"
    )
}

/// Every statement that changes several rows locks them first in one order (by name), so
/// that two of them (a write and a renewal, say) never wait on each other in a circle: the
/// server would break that after its `deadlock_timeout`, a second.
///
/// Writes the rows `$1` (names) with, for each, the version read (`$2`, 0: no row), its new
/// state (`$3`, null: delete the row) and when it may be swept (`$4`, microseconds; null:
/// never); notifies `$5` (each `<payload> <lock channel>`) on `channel`; takes `$6` tokens.
/// Answers the tokens, ascending.
pub(crate) fn write(schema: &str, channel: &str) -> String {
    format!(
        "WITH input AS ( \
             SELECT * FROM unnest($1::text[], $2::int8[], $3::jsonb[], $4::int8[]) \
                 AS i(name, version, state, expires) \
         ), locked AS ( \
             SELECT l.name FROM {schema}.locks l WHERE l.name = ANY($1::text[]) \
             ORDER BY l.name FOR UPDATE \
         ), updated AS ( \
             UPDATE {schema}.locks l SET version = nextval('{schema}.tokens'), state = i.state, \
                 expires_at = to_timestamp(i.expires / 1000000.0) \
             FROM input i JOIN locked k ON k.name = i.name \
             WHERE l.name = i.name AND i.version <> 0 AND i.state IS NOT NULL \
                 AND l.version = i.version \
             RETURNING 1 \
         ), deleted AS ( \
             DELETE FROM {schema}.locks l USING input i JOIN locked k ON k.name = i.name \
             WHERE l.name = i.name AND i.version <> 0 AND i.state IS NULL \
                 AND l.version = i.version \
             RETURNING 1 \
         ), inserted AS ( \
             INSERT INTO {schema}.locks (name, version, state, expires_at) \
             SELECT i.name, nextval('{schema}.tokens'), i.state, \
                 to_timestamp(i.expires / 1000000.0) \
             FROM input i WHERE i.version = 0 AND i.state IS NOT NULL \
             ON CONFLICT (name) DO NOTHING \
             RETURNING 1 \
         ), written AS ( \
             SELECT {schema}.written_all( \
                 (SELECT count(*) FROM updated) + (SELECT count(*) FROM deleted) \
                     + (SELECT count(*) FROM inserted), \
                 cardinality($1::text[])) AS n \
         ), notified AS ( \
             SELECT count(pg_notify('{channel}', note)) AS n \
             FROM written, unnest($5::text[]) AS note \
         ) \
         SELECT notified.n, ARRAY( \
             SELECT t FROM (SELECT nextval('{schema}.tokens') AS t \
                 FROM written, generate_series(1, $6::int)) AS taken ORDER BY t) \
         FROM notified"
    )
}

/// Renews leases in one statement of its own (no turn: it changes a row only where the grant
/// is still its owner's and unexpired, and its new version makes any operation that read the
/// row before read it again): for each `$1` name, `$2` owner, `$3` side (`w` the writer, `r` a
/// reader, `p` a permit holder) and `$4` lease in microseconds, the grant's end set to the
/// database's clock plus the lease. Answers the positions (1-based) of the grants renewed.
/// A name appears once per statement (a row is changed once by one statement).
pub(crate) fn renew(schema: &str) -> String {
    format!(
        "WITH input AS ( \
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[]) \
                 WITH ORDINALITY AS i(name, owner, side, lease, n) \
         ), clock AS ( \
             SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us \
         ), locked AS ( \
             SELECT l.name FROM {schema}.locks l WHERE l.name = ANY($1::text[]) \
             ORDER BY l.name FOR UPDATE \
         ), renewed AS ( \
             UPDATE {schema}.locks l SET \
                 state = CASE i.side \
                     WHEN 'w' THEN jsonb_set(l.state, '{{w,1}}', to_jsonb(clock.us + i.lease)) \
                     WHEN 'r' THEN jsonb_set(l.state, ARRAY['r', i.owner], \
                         to_jsonb(clock.us + i.lease)) \
                     ELSE jsonb_set(l.state, ARRAY['p', 'h', i.owner], \
                         to_jsonb(clock.us + i.lease)) END, \
                 version = nextval('{schema}.tokens'), \
                 expires_at = greatest(l.expires_at, \
                     to_timestamp((clock.us + i.lease) / 1000000.0)) \
             FROM input i JOIN locked k ON k.name = i.name, clock \
             WHERE l.name = i.name AND CASE i.side \
                 WHEN 'w' THEN l.state->'w'->>0 = i.owner \
                     AND (l.state->'w'->>1)::bigint > clock.us \
                 WHEN 'r' THEN (l.state->'r'->>i.owner)::bigint > clock.us \
                 ELSE (l.state->'p'->'h'->>i.owner)::bigint > clock.us END \
             RETURNING i.n \
         ) \
         SELECT n FROM renewed"
    )
}

/// Deletes up to 1,000 rows whose every part ran out more than a second ago (a holder that
/// crashed and a key nobody asked for again): the table follows the locks in use. Rows
/// another statement has locked are skipped, for the next sweep.
pub(crate) fn sweep(schema: &str) -> String {
    format!(
        "DELETE FROM {schema}.locks WHERE name IN ( \
             SELECT name FROM {schema}.locks \
             WHERE expires_at < clock_timestamp() - interval '1 second' \
             ORDER BY name LIMIT 1000 FOR UPDATE SKIP LOCKED)"
    )
}

/// The names of the keys in use that match the `LIKE` pattern `$1`, at most `$2`.
pub(crate) fn scan(schema: &str) -> String {
    format!(
        "SELECT name FROM {schema}.locks \
         WHERE name LIKE $1 AND (expires_at IS NULL OR expires_at > clock_timestamp()) \
         ORDER BY name LIMIT $2"
    )
}
