/*
 * psyche coordinator: the run's state machine as a Solana program (sBPF v0).
 *
 * The rules are those of src/core/coordinator/machine.ts (the reference); function names follow it.
 * The account layout is `State` below; src/core/backend/solana/layout.ts decodes it and
 * docs in programs/README.md list it. Every instruction either applies completely or fails with a
 * custom error code (the runtime then discards every change), so the rules can mutate in place.
 *
 * Limits of sBPF shape the code: at most 5 arguments per function, no signed division, no mutable
 * globals, 4 KiB stack frames (big structures live in the account, never on the stack).
 */
#include "../include/sbpf.h"

/* Capacities, enums and the account structs (State, Round, ...) are generated from the layout table
 * (src/core/layout/layout-table.ts) into ../include/psyche_layout.h by `npm run build:programs`. */
#include "../include/psyche_layout.h"

#define STR_(x) #x
#define STR(x) STR_(x) /* a capacity's value in a message: "MAX_CLIENTS = " STR(MAX_CLIENTS) */

static u64 read_u16(const u8 *p) { return (u64)p[0] | ((u64)p[1] << 8); }

#define ACTIVE(s) ((s) == ROUND_TRAIN || (s) == ROUND_WITNESS || (s) == COOLDOWN)
#define HALTED(s) ((s) == UNINITIALIZED || (s) == FINISHED || (s) == PAUSED)

static u64 fail(u64 code, const char *why) {
  log(why);
  return code;
}

/* ---- pure rules (rules.ts) ---- */

static u64 witness_count(const State *s, u64 roster) {
  u64 wanted = s->config.witness_nodes == 0 ? MAX_WITNESSES : s->config.witness_nodes;
  return wanted < roster ? wanted : roster;
}

static u64 witness_quorum(u64 witnesses) {
  if (witnesses <= 2) return witnesses;
  if (witnesses == 3) return 2;
  return (witnesses * 2) / 3;
}

/* Math.round(start + (end - start) * tokens / warmup), with end ≥ start (validated). */
static u64 global_batch_size(const State *s, u64 tokens) {
  const Config *c = &s->config;
  if (tokens >= c->global_batch_size_warmup_tokens) return c->global_batch_size_end;
  u64 w = c->global_batch_size_warmup_tokens;
  return c->global_batch_size_start + ((c->global_batch_size_end - c->global_batch_size_start) * tokens * 2 + w) / (2 * w);
}

/* The batches of a round starting at batch data_index: the global batch size times the optimizer's inner steps per
 * round (SparseLoCo's H, 1 for every other optimizer), as the reference's roundBatchSize. */
static u64 round_batch_size(const State *s, u64 data_index) {
  return global_batch_size(s, data_index * s->max_seq_len) * s->inner_steps;
}

static void sub_seed(const u8 *seed, const char *label, u8 *out) {
  u64 n = 0;
  while (label[n]) n++;
  sha256_2(seed, 32, (const u8 *)label, n, out);
}

/* Swap-or-not shuffle (shuffle.ts): where `index` lands among n; `inverse` runs the rounds backwards. */
static u64 shuffle_index(u64 index, u64 n, const u8 *seed, int inverse) {
  u8 buf[40];
  u8 h[32];
  copy(buf, seed, 32);
  for (u64 i = 0; i < SHUFFLE_ROUNDS; i++) {
    u64 r = inverse ? SHUFFLE_ROUNDS - 1 - i : i;
    buf[32] = (u8)r;
    sha256_2(buf, 33, NULL, 0, h);
    u64 pivot = read_u64(h) % n;
    u64 flip = (pivot + n - index) % n;
    u64 position = index > flip ? index : flip;
    u64 chunk = position / 256;
    buf[33] = (u8)chunk;
    buf[34] = (u8)(chunk >> 8);
    buf[35] = (u8)(chunk >> 16);
    buf[36] = (u8)(chunk >> 24);
    sha256_2(buf, 37, NULL, 0, h);
    if ((h[(position % 256) >> 3] >> (position % 8)) & 1) index = flip;
  }
  return index;
}

static i64 roster_index(const Round *r, const u8 *key) {
  for (u64 i = 0; i < r->roster_len; i++)
    if (equal(r->roster[i], key, 32)) return (i64)i;
  return -1;
}

static int is_witness(const State *s, const Round *r, const u8 *key) {
  i64 i = roster_index(r, key);
  if (i < 0) return 0;
  u8 seed[32];
  sub_seed(r->seed, "witness", seed);
  return shuffle_index((u64)i, r->roster_len, seed, 0) < witness_count(s, r->roster_len);
}

/* verifierCount: verification_percent of the roster, at least one when it is not 0. */
static u64 verifier_count(const State *s, u64 roster) {
  u64 pct = s->config.verification_percent;
  if (pct == 0 || roster == 0) return 0;
  u64 n = (pct * roster + 99) / 100;
  if (n < 1) n = 1;
  return n < roster ? n : roster;
}

/* trainerCount: config.max_trainers_per_round when the roster is larger (0: not set), else the whole roster. A round
 * records it when it starts (Round.trainers): an update while Paused changes neither its batches nor its blooms. */
static u64 trainer_count(const State *s, u64 roster) {
  u64 cap = s->config.max_trainers_per_round;
  return cap > 0 && cap < roster ? cap : roster;
}

/* witnessBloomParams: both witness blooms of a round are sized for its trainers (Round.trainers; a witness adds only
 * members with batches), at least 1: a proof is BLOOM_BITS[bloom_size - 1] / 8 bytes per bloom, BLOOM_HASHES[bloom_size - 1] probes. */
static u64 bloom_size(const Round *r) {
  return r->trainers ? r->trainers : 1;
}

/* The batch range [start, end) of a roster member (rangeForPosition of its shuffled position): the first t positions
 * train (t = Round.trainers), the others get an empty range at the round's end. */
static void batch_range(const State *s, const Round *r, u64 index, u64 *start, u64 *end) {
  u8 seed[32];
  sub_seed(r->data_seed, "data", seed);
  u64 n = r->trainers;
  u64 position = shuffle_index(index, r->roster_len, seed, 0);
  if (position >= n) {
    *start = *end = r->data_index + r->batch_size;
    return;
  }
  u64 base = r->batch_size / n;
  u64 extra = r->batch_size % n;
  *start = r->data_index + position * base + (position < extra ? position : extra);
  *end = *start + base + (position < extra ? 1 : 0);
}

/* verification_sample: the program stores none, so rules.ts DEFAULT_VERIFICATION_SAMPLE (layout.ts refuses another). */
#define VERIFICATION_SAMPLE 4

/* scoreWindow / inWindow (rules.ts): whether the verifier at shuffled position j (of n, v verifiers) scores the
 * trainer at shuffled position t. Its slot is j*n/v; its window the K = min(sample, n - 1) positions after the slot,
 * one longer where it steps over itself; the slot itself counts as distance n. */
static int in_score_window(u64 j, u64 t, u64 n, u64 v) {
  if (j == t) return 0;
  u64 slot = j * n / v;
  u64 k = VERIFICATION_SAMPLE < n - 1 ? VERIFICATION_SAMPLE : n - 1;
  u64 self = (j + n - slot) % n;
  u64 size = self >= 1 && self <= k ? k + 1 : k;
  u64 d = (t + n - slot) % n;
  return (d == 0 ? n : d) <= size;
}

/* isScoreAssigned and scoreAssignedCount (rules.ts) at once, for a low-score accusation of round r: whether the
 * verifier is assigned the trainer's result of the previous round, and how many verifiers are (*count). One shuffle
 * each for the verifier, the trainer and the trainer's previous batch range: the windows are positions. */
static int score_assigned(const State *s, const Round *r, const u8 *verifier, const u8 *trainer, u64 *count) {
  *count = 0;
  if (!s->has_previous_round || s->previous_round.step + 1 != r->step) return 0;
  i64 vi = roster_index(r, verifier), ti = roster_index(r, trainer), si = roster_index(&s->previous_round, trainer);
  if (vi < 0 || ti < 0 || si < 0) return 0;
  u64 start = 0, end = 0;
  batch_range(s, &s->previous_round, (u64)si, &start, &end);
  if (end <= start) return 0;
  u64 n = r->roster_len, v = verifier_count(s, n);
  u8 seed[32];
  sub_seed(r->seed, "verify", seed);
  u64 t = shuffle_index((u64)ti, n, seed, 0);
  u64 j = shuffle_index((u64)vi, n, seed, 0);
  for (u64 p = 0; p < v; p++) *count += (u64)in_score_window(p, t, n, v);
  return j < v && in_score_window(j, t, n, v);
}

static const char HEX[] = "0123456789abcdef";

/* A client's id as the reference spells it (ClientId): its public key in lowercase hex (64 characters), the
 * spelling psyche's clients use everywhere (p2p announcements, peer ids); the key's base58 is only its Solana
 * address. */
static void hex_id(const u8 *key, u8 *out) {
  for (u64 i = 0; i < 32; i++) {
    out[2 * i] = HEX[key[i] >> 4];
    out[2 * i + 1] = HEX[key[i] & 15];
  }
}

/* Whether a bloom holds the item of this probe. Position i is fold(K * (h1 + i * h2) mod 2^64) mod bits with
 * fold(x) = x ^ (x >> 32) (bloom.ts positionsOf: plain double hashing modulo a 64-bit filter let two trainers set the
 * same bits once in 2,048 pairs). Cheap on purpose: a witness proof checks every trainer of the round. */
static int bloom_contains(const u8 *bloom, u64 bits, u64 hashes, u64 probe) {
  u64 g = probe & 0xffffffffull;
  u64 h2 = probe >> 32;
  for (u64 i = 0; i < hashes; i++, g += h2) {
    u64 x = g * 0x9e3779b97f4a7c15ull;
    u64 p = (x ^ (x >> 32)) % bits;
    if ((bloom[p >> 3] & (1 << (p & 7))) == 0) return 0;
  }
  return 1;
}

/* participantKey(id): sha256("psyche/participant\0" || hex(id)). */
static void participant_key(const u8 *key, u8 *out) {
  static const char prefix[] = "psyche/participant";
  u8 item[19 + 64];
  copy(item, prefix, 19); /* the label and its terminating NUL */
  hex_id(key, item + 19);
  sha256_2(item, 19 + 64, NULL, 0, out);
}

/* The bloom probe of a client's participant key: h1 | h2 << 32 from SHA-256(participantKey(id)) (bloom.ts). Computed
 * once, when the client joins, and kept with its key (pending_probe, ClientRec.probe, roster_probe), so checking a
 * witness proof costs no hashing per trainer. */
__attribute__((noinline)) static u64 participant_probe(const u8 *key) {
  u8 k[32], d[32];
  participant_key(key, k);
  sha256_2(k, 32, NULL, 0, d);
  return (u64)read_u32(d) | ((u64)(read_u32(d + 4) | 1) << 32);
}

/* isTrainerHealthy: a quorum of the round's witnesses have the trainer in their participant bloom. */
static int trainer_healthy(const State *s, const Round *r, u64 probe) {
  u64 size = bloom_size(r);
  u64 bits = BLOOM_BITS[size - 1];
  u64 hashes = BLOOM_HASHES[size - 1];
  u64 score = 0;
  for (u64 w = 0; w < r->witness_len; w++)
    if (bloom_contains(r->witnesses[w].participant_bloom, bits, hashes, probe)) score++;
  return score >= witness_quorum(witness_count(s, r->roster_len));
}

/* Round.roster_mark: the witnesses whose participant bloom holds the member (low 7 bits; at most MAX_WITNESSES), and
 * this bit when its result is excluded (a quorum's accusation, an equivocation proof). */
#define MARK_EXCLUDED 0x80

/*
 * One witness proof's participant bloom over the roster: counts, per trainer, the proofs that hold it (for the rewards
 * ledger's accepted results, credit_round), and returns attestsEveryTrainer (machine.ts): the bloom names every
 * trainer of the round. Only rounds where every member trains count (at least as many batches as members, no
 * max_trainers_per_round below the roster): finding the empty-handed members would cost a shuffle each, which the
 * compute budget does not allow.
 */
static int mark_witnessed(const State *s, Round *r, const u8 *bloom) {
  u64 size = bloom_size(r);
  u64 bits = BLOOM_BITS[size - 1];
  u64 hashes = BLOOM_HASHES[size - 1];
  int every = r->roster_len <= r->batch_size && r->trainers == r->roster_len;
  for (u64 i = 0; i < r->roster_len; i++) {
    if (bloom_contains(bloom, bits, hashes, r->roster_probe[i])) r->roster_mark[i]++;
    else every = 0;
  }
  return every;
}

/* ---- the rewards ledger (rewards.ts) ---- */

/*
 * The ledger entry of `key` (1 + its index): its own, else a new one, appended while the ledger has room, else one
 * that holds nothing (no results, no points) of a client that has not joined for 3 epochs. 0 when there is none: the
 * client trains and earns nothing (logged), and the run's rules do not change. Marks the entry as joined now.
 */
static u64 ledger_slot(State *s, const u8 *key) {
  u64 found = 0;
  for (u64 i = 0; i < s->ledger_len; i++) {
    Points *e = &s->ledger[i];
    if (equal(e->key, key, 32)) {
      e->last_epoch = s->progress_epoch;
      return i + 1;
    }
    if (!found && (e->rounds | e->epoch_rounds | e->earned | e->slashed) == 0 && e->last_epoch + 3 <= s->progress_epoch) found = i + 1;
  }
  if (!found && s->ledger_len < LEDGER_MAX) found = ++s->ledger_len;
  if (!found) {
    log("rewards ledger full (LEDGER_MAX = " STR(LEDGER_MAX) " clients holding points): this client earns no points");
    return 0;
  }
  Points *e = &s->ledger[found - 1];
  zero(e, sizeof(Points));
  copy(e->key, key, 32);
  e->last_epoch = s->progress_epoch;
  return found;
}

/*
 * The shuffled positions extras_progress follows, [*first, *first + count) (the count is returned). When every member
 * trains: those below batch_size % n, which have one batch more (or the others, whichever are fewer). With
 * max_trainers_per_round below the roster: the t = Round.trainers positions that train, in order.
 */
static u64 followed_positions(const State *s, const Round *r, u64 *first) {
  u64 n = r->roster_len, t = r->trainers;
  *first = 0;
  if (t < n) return t;
  u64 extra = n ? r->batch_size % n : 0;
  if (extra <= n - extra) return extra;
  *first = extra;
  return n - extra;
}

/*
 * Which roster members have how many batches (batch_range): the inverse shuffle of the followed positions
 * (followed_positions), all at once. With n <= 256 every position reads hash chunk 0, so each of the 90 rounds hashes
 * twice for the whole roster, not twice per member as shuffle_index would. Still ~2.7k CU a round at 256 trainers, so
 * the round's witness proofs run it in slices (on_witness): this runs its rounds from r->extra_rounds up to `upto`,
 * its state in r->extra_at.
 */
static void extras_progress(const State *s, Round *r, u64 upto) {
  u64 n = r->roster_len;
  if (upto > SHUFFLE_ROUNDS) upto = SHUFFLE_ROUNDS;
  if (n == 0 || r->extra_rounds >= upto) return;
  u64 first;
  u64 count = followed_positions(s, r, &first);
  if (r->extra_rounds == 0)
    for (u64 k = 0; k < count; k++) r->extra_at[k] = (u8)(first + k);
  u8 buf[40], h[32], bits[32];
  sub_seed(r->data_seed, "data", buf);
  zero(buf + 32, 8);
  for (u64 i = r->extra_rounds; i < upto && count; i++) {
    buf[32] = (u8)(SHUFFLE_ROUNDS - 1 - i);
    sha256_2(buf, 33, NULL, 0, h);
    u64 pivot_n = read_u64(h) % n + n;
    sha256_2(buf, 37, NULL, 0, bits);
    for (u8 *p = r->extra_at, *end = r->extra_at + count; p < end; p++) {
      u64 index = *p;
      u64 flip = pivot_n - index;
      if (flip >= n) flip -= n;
      u64 position = index > flip ? index : flip;
      if ((bits[position >> 3] >> (position & 7)) & 1) *p = (u8)flip;
    }
  }
  r->extra_rounds = upto;
}

/* A witness proof's slice of extras_progress: the k-th proof runs it up to k × ceil(90 / quorum) rounds, so the
 * quorum of proofs that any accepted result needs has run all of it by the round's close; a proof runs at most
 * EXTRAS_PER_PROOF positions × rounds (~85k CU), and the round's close runs what is left (a run with one witness). */
#define EXTRAS_PER_PROOF 3584
static void extras_slice(const State *s, Round *r) {
  u64 n = r->roster_len;
  if (n == 0) return;
  u64 first;
  u64 count = followed_positions(s, r, &first);
  u64 quorum = witness_quorum(witness_count(s, n));
  u64 per = quorum ? (SHUFFLE_ROUNDS + quorum - 1) / quorum : SHUFFLE_ROUNDS;
  if (count && per > EXTRAS_PER_PROOF / count) per = EXTRAS_PER_PROOF / count ? EXTRAS_PER_PROOF / count : 1;
  extras_progress(s, r, r->extra_rounds + per);
}

/* A round closes (acceptedResults): each roster member that a witness quorum saw, whose result was not excluded and
 * whose batch range is not empty, is credited the round and its batches in the current epoch. A round with a witness
 * quorum also judges its trainers (dropUnseen): each Healthy member with batches that no quorum saw is Dropped. The
 * roster is the epoch's clients in order (start_round_train copies them; nothing compacts clients during a round), so
 * roster member i is clients[i]; the key is compared anyway before a drop. */
__attribute__((noinline)) static void credit_round(State *s, Round *r) {
  u64 n = r->roster_len;
  if (n == 0 || r->witness_len == 0) return;
  u64 quorum = witness_quorum(witness_count(s, n));
  int judged = r->witness_len >= quorum;
  u64 t = r->trainers;
  u64 base = r->batch_size / t;
  u64 extra = r->batch_size % t;
  u64 first;
  u64 count = followed_positions(s, r, &first);
  extras_progress(s, r, SHUFFLE_ROUNDS); /* the rest, if fewer proofs than a quorum ran it (then nobody is accepted) */
  /* per member: 0 no batches (not chosen this round), 1 base, 2 base + 1 */
  u8 share[MAX_CLIENTS];
  for (u64 i = 0; i < n; i++) share[i] = t < n ? 0 : first ? 2 : 1;
  for (u64 k = 0; k < count; k++) share[r->extra_at[k]] = t < n ? (k < extra ? 2 : 1) : first ? 1 : 2;
  for (u64 i = 0; i < n; i++) {
    u64 mark = r->roster_mark[i];
    u64 batches = share[i] ? base + share[i] - 1 : 0;
    u64 slot = r->roster_ledger[i];
    if (judged && batches && (mark & ~(u64)MARK_EXCLUDED) < quorum && i < s->clients_len && s->clients[i].state == HEALTHY &&
        equal(s->clients[i].key, r->roster[i], 32))
      s->clients[i].state = DROPPED;
    if ((mark & MARK_EXCLUDED) || mark < quorum || batches == 0 || slot == 0) continue;
    Points *e = &s->ledger[slot - 1];
    e->epoch_rounds++;
    e->epoch_batches += batches;
  }
}

/* rewardWeight (rewards.ts): clamp(floor(score × WEIGHT_ONE / FULL_WEIGHT_SCORE), 0, WEIGHT_ONE) in parts per million;
 * WEIGHT_ONE in a run without verifiers, 0 for a client never scored. */
static u64 reward_weight(const Points *e, int verified) {
  if (!verified) return WEIGHT_ONE;
  if (e->count == 0 || e->score <= 0) return 0;
  u64 w = (u64)e->score * WEIGHT_ONE / FULL_WEIGHT_SCORE;
  return w < WEIGHT_ONE ? w : WEIGHT_ONE;
}

/* One entry's epoch settles: its accepted batches earn floor(batches × points_per_batch × weight / WEIGHT_ONE)
 * points (pointsFor), slashed instead when the client was ejected in the epoch. */
static void settle(const State *s, Points *e, int verified, int ejected) {
  u64 points = e->epoch_batches * s->points_per_batch * reward_weight(e, verified) / WEIGHT_ONE;
  e->rounds += e->epoch_rounds;
  e->batches += e->epoch_batches;
  e->epoch_rounds = 0;
  e->epoch_batches = 0;
  if (ejected) e->slashed += points;
  else e->earned += points;
}

/* The end of an epoch (settleEpoch): the ejected clients' entries first (clients and exited), then every other. */
__attribute__((noinline)) static void settle_epoch(State *s) {
  int verified = verifier_count(s, 1) > 0;
  for (u64 i = 0; i < s->clients_len; i++)
    if (s->clients[i].state == EJECTED && s->clients[i].ledger) settle(s, &s->ledger[s->clients[i].ledger - 1], verified, 1);
  for (u64 i = 0; i < s->exited_len; i++)
    if (s->exited[i].state == EJECTED && s->exited[i].ledger) settle(s, &s->ledger[s->exited[i].ledger - 1], verified, 1);
  for (u64 i = 0; i < s->ledger_len; i++)
    if (s->ledger[i].epoch_rounds) settle(s, &s->ledger[i], verified, 0);
}

/*
 * settleEpoch's bound (rewards.ts): an entry that holds nothing (no results, no points) of a client that is no member
 * of the run (a joiner) nor of the epoch that ended (clients, exited) forgets its score, as the reference drops it. Run
 * at the end of the Cooldown tick, on the state the reference settles with.
 */
__attribute__((noinline)) static void forget_scores(State *s) {
  u8 member[LEDGER_MAX];
  zero(member, sizeof(member));
  for (u64 i = 0; i < s->clients_len; i++)
    if (s->clients[i].ledger) member[s->clients[i].ledger - 1] = 1;
  for (u64 i = 0; i < s->exited_len; i++)
    if (s->exited[i].ledger) member[s->exited[i].ledger - 1] = 1;
  for (u64 i = 0; i < s->pending_len; i++)
    if (s->pending_ledger[i]) member[s->pending_ledger[i] - 1] = 1;
  for (u64 i = 0; i < s->ledger_len; i++) {
    Points *e = &s->ledger[i];
    if (member[i] || e->count == 0 || (e->rounds | e->epoch_rounds | e->earned | e->slashed) != 0) continue;
    e->score = e->last = e->before = e->sum = 0;
    e->last_step = e->count = 0;
    e->verifiers = e->has_before = 0;
  }
}

/* ---- helpers over a state (machine.ts) ---- */

/* Every phase change is logged with sol_log_data ("Program data: " + base64 in the transaction's logs) for indexers and
 * explorers: "PSYSTATE" ‖ run_state u64 ‖ run_state_start u64 (unix ms) ‖ step u64 ‖ epoch u64 (decodeStateLog). */
static void change_state(State *s, u64 now, u64 next) {
  s->run_state = next;
  s->run_state_start = now;
  u64 record[5] = {STATE_LOG_MAGIC, next, now, s->progress_step, s->progress_epoch};
  SolBytes data = {(const u8 *)record, sizeof(record)};
  sol_log_data(&data, 1);
}

/* Times are unix milliseconds (the reference's clock); config durations are whole seconds. */
static int timed_out(const State *s, u64 now, u64 duration) {
  return now != s->run_state_start && now >= s->run_state_start + duration * 1000;
}

static i64 client_index(const State *s, const u8 *key) {
  for (u64 i = 0; i < s->clients_len; i++)
    if (equal(s->clients[i].key, key, 32)) return (i64)i;
  return -1;
}

static i64 pending_index(const State *s, const u8 *key) {
  for (u64 i = 0; i < s->pending_len; i++)
    if (equal(s->pending[i], key, 32)) return (i64)i;
  return -1;
}

static void remove_pending(State *s, u64 p) {
  for (u64 i = p + 1; i < s->pending_len; i++) {
    copy(s->pending[i - 1], s->pending[i], 32);
    s->pending_probe[i - 1] = s->pending_probe[i];
    s->pending_client[i - 1] = s->pending_client[i];
    s->pending_ledger[i - 1] = s->pending_ledger[i];
  }
  s->pending_len--;
}

/*
 * Whether joiner j is a client of the epoch (with `healthy`, a Healthy one). pending_client says where it was in
 * clients when it was queued; that place is still right whenever it matters: a joiner can be in clients only if it
 * was queued while there (in WaitingForMembers or Paused, by join or keep_healthy_as_pending), and clients is
 * compacted (move_exited) only in an epoch, after Warmup emptied pending. The key is compared anyway.
 */
static int pending_is_client(const State *s, u64 j, int healthy) {
  u64 at = s->pending_client[j];
  if (at == 0 || at > s->clients_len) return 0;
  const ClientRec *c = &s->clients[at - 1];
  return (!healthy || c->state == HEALTHY) && equal(c->key, s->pending[j], 32);
}

/* How many clients the next epoch would hold: the Healthy clients (keep_healthy_as_pending carries them) and the
 * joiners that are not among them (nextEpochSize). */
static u64 next_epoch_size(const State *s) {
  u64 n = 0;
  for (u64 i = 0; i < s->clients_len; i++)
    if (s->clients[i].state == HEALTHY) n++;
  for (u64 j = 0; j < s->pending_len; j++)
    if (!pending_is_client(s, j, 1)) n++;
  return n;
}

static void move_exited(State *s, u64 height) {
  u64 kept = 0;
  for (u64 i = 0; i < s->clients_len; i++) {
    ClientRec *c = &s->clients[i];
    if (c->state == HEALTHY) {
      if (kept != i) copy(&s->clients[kept], c, sizeof(ClientRec));
      kept++;
    } else {
      /* exited_len < MAX_CLIENTS: each client of the epoch exits at most once */
      ClientRec *e = &s->exited[s->exited_len++];
      copy(e, c, sizeof(ClientRec));
      e->exited_height = height;
    }
  }
  s->clients_len = kept;
}

static u64 current_height(const State *s) {
  return s->has_round ? s->round.height : 0;
}

static u64 next_data_index(const State *s) {
  return s->has_round ? s->round.data_index + s->round.batch_size : s->epoch_start_data_index;
}

/* Healthy clients go first in the pending list, then the other pending joiners: in place, in linear time. */
__attribute__((noinline)) static void keep_healthy_as_pending(State *s) {
  u64 m = 0; /* the joiners that are not Healthy clients, kept in order */
  for (u64 j = 0; j < s->pending_len; j++) {
    if (pending_is_client(s, j, 1)) continue;
    if (m != j) {
      copy(s->pending[m], s->pending[j], 32);
      s->pending_probe[m] = s->pending_probe[j];
      s->pending_client[m] = s->pending_client[j];
      s->pending_ledger[m] = s->pending_ledger[j];
    }
    m++;
  }
  u64 h = 0;
  for (u64 i = 0; i < s->clients_len; i++)
    if (s->clients[i].state == HEALTHY) h++;
  /* h + m <= MAX_CLIENTS: join keeps next_epoch_size below it */
  if (h)
    for (u64 j = m; j-- > 0;) {
      copy(s->pending[h + j], s->pending[j], 32);
      s->pending_probe[h + j] = s->pending_probe[j];
      s->pending_client[h + j] = s->pending_client[j];
      s->pending_ledger[h + j] = s->pending_ledger[j];
    }
  u64 n = 0;
  for (u64 i = 0; i < s->clients_len; i++) {
    if (s->clients[i].state != HEALTHY) continue;
    copy(s->pending[n], s->clients[i].key, 32);
    s->pending_probe[n] = s->clients[i].probe;
    s->pending_client[n] = i + 1;
    s->pending_ledger[n] = s->clients[i].ledger;
    n++;
  }
  s->pending_len = h + m;
}

static void start_waiting_for_members(State *s, u64 now) {
  u64 next = s->progress_step > s->config.total_steps ? FINISHED : WAITING_FOR_MEMBERS;
  keep_healthy_as_pending(s);
  change_state(s, now, next);
}

static void checkpoint_to_p2p(State *s) {
  u8 kind = s->checkpoint.kind;
  if (kind != CK_HUB && kind != CK_DUMMY) return;
  copy(&s->checkpoint_fallback, &s->checkpoint, sizeof(Checkpoint));
  s->checkpoint.kind = CK_P2P;
}

/* Decimal digits of v (no sign) at out; returns their count. */
static u64 decimal(u64 v, u8 *out) {
  u8 digits[20];
  u64 n = 0;
  do {
    digits[n++] = (u8)('0' + v % 10);
    v /= 10;
  } while (v);
  for (u64 i = 0; i < n; i++) out[i] = digits[n - 1 - i];
  return n;
}

/* The clock's slot and unix timestamp as "slot:unix_timestamp" (decimal; a negative timestamp with its sign). */
__attribute__((noinline)) static u64 clock_entropy(u8 *out) {
  SolClock clock;
  sol_get_clock_sysvar(&clock);
  u64 n = decimal(clock.slot, out);
  out[n++] = ':';
  if (clock.unix_timestamp < 0) {
    out[n++] = '-';
    return n + decimal((u64)0 - (u64)clock.unix_timestamp, out + n);
  }
  return n + decimal((u64)clock.unix_timestamp, out + n);
}

static void start_round_train(State *s, u64 now) {
  move_exited(s, current_height(s));
  int has_previous = !s->first_round;
  u64 data_index = has_previous ? next_data_index(s) : s->epoch_start_data_index;
  if (has_previous) copy(&s->previous_round, &s->round, sizeof(Round));
  /* The round's seed: SHA-256(previous seed ‖ step u64 ‖ entropy), the entropy being the cluster clock at the round's
   * start spelled "slot:unix_timestamp" in decimal (clockEntropy in the reference), so nobody can compute a round's
   * witnesses, verifiers and batches before the slot it starts in. */
  u8 step[8];
  write_u64(step, s->progress_step);
  u8 entropy[48];
  u64 entropy_len = clock_entropy(entropy);
  SolBytes parts[3] = {{s->seed, 32}, {step, 8}, {entropy, entropy_len}};
  sol_sha256(parts, 3, s->seed);
  Round *r = &s->round;
  u64 height = has_previous ? s->previous_round.height + 1 : 0;
  zero(r, sizeof(Round));
  r->step = s->progress_step;
  r->height = height;
  r->data_index = data_index;
  r->batch_size = round_batch_size(s, data_index);
  copy(r->seed, s->seed, 32);
  /* The data shuffle is known one round ahead (rules.ts nextDataSeed): from the previous round's seed; the epoch's
   * first round's is its own seed. */
  if (has_previous) sub_seed(s->previous_round.seed, "next-data", r->data_seed);
  else copy(r->data_seed, s->seed, 32);
  r->started_at = now;
  r->roster_len = s->clients_len;
  r->trainers = trainer_count(s, s->clients_len);
  for (u64 i = 0; i < s->clients_len; i++) {
    copy(r->roster[i], s->clients[i].key, 32);
    r->roster_probe[i] = s->clients[i].probe;
    r->roster_ledger[i] = (u16)s->clients[i].ledger; /* at most LEDGER_MAX */
  }
  s->has_round = 1;
  s->has_previous_round = has_previous;
  s->first_round = 0;
  change_state(s, now, ROUND_TRAIN);
}

static void empty_epoch(State *s, u64 now) {
  s->epoch_start_time = now;
  s->epoch_start_step = s->progress_step;
  s->first_round = 1;
  s->checkpointed = 0;
  s->clients_len = 0;
  s->exited_len = 0;
  s->warmup_len = 0;
  s->has_round = 0;
  s->has_previous_round = 0;
  zero(s->exited, sizeof(s->exited));
  zero(s->warmup_witnesses, sizeof(s->warmup_witnesses));
  zero(&s->round, sizeof(Round));
  zero(&s->previous_round, sizeof(Round));
  s->hash_witness_len = 0;
  zero(s->hash_witnesses, sizeof(s->hash_witnesses));
}

/* ---- ticks ---- */

/* isCurrentCheckpoint (rules.ts): any checkpoint before an epoch recorded the run's model, then only the Hub checkpoint
 * recorded with the current model's parameter hash. */
static int is_current_checkpoint(const State *s, const Checkpoint *c) {
  if (!s->has_current_model) return 1;
  if (!s->has_current_model_hash || !s->has_checkpoint_hash || !equal(s->checkpoint_hash, s->current_model_hash, 32)) return 0;
  const Checkpoint *r = &s->checkpoint_hash_repo;
  return c->kind == CK_HUB && c->repo_len == r->repo_len && equal(c->repo, r->repo, c->repo_len) && c->has_revision == r->has_revision &&
         c->revision_len == r->revision_len && equal(c->revision, r->revision, c->revision_len);
}

static void tick_waiting_for_members(State *s, u64 now) {
  if (s->pending_len < s->config.init_min_clients || !timed_out(s, now, s->config.waiting_for_members_extra_time)) return;
  int previous_present = 0; /* a client of the last epoch that ran (it had a round) is back */
  for (u64 j = 0; s->has_round && j < s->pending_len && !previous_present; j++) previous_present = pending_is_client(s, j, 0);
  /* only a fallback that holds the run's current model: never an older one (the epoch stays P2P, and waits) */
  if (!previous_present && s->checkpoint.kind == CK_P2P && s->checkpoint_fallback.kind != CK_NONE && is_current_checkpoint(s, &s->checkpoint_fallback))
    copy(&s->checkpoint, &s->checkpoint_fallback, sizeof(Checkpoint));
  empty_epoch(s, now);
  for (u64 i = 0; i < s->pending_len; i++) {
    copy(s->clients[i].key, s->pending[i], 32);
    s->clients[i].state = HEALTHY;
    s->clients[i].exited_height = 0;
    s->clients[i].probe = s->pending_probe[i];
    s->clients[i].ledger = s->pending_ledger[i];
    if (s->pending_ledger[i]) s->ledger[s->pending_ledger[i] - 1].last_epoch = s->progress_epoch;
  }
  s->clients_len = s->pending_len;
  s->pending_len = 0;
  if (s->has_next_rates) { /* set_rates: an epoch's rates are fixed when it begins */
    s->points_per_batch = s->next_points_per_batch;
    s->token_rate = s->next_token_rate;
    s->has_next_rates = 0;
  }
  change_state(s, now, WARMUP);
}

static void tick_warmup(State *s, u64 now) {
  move_exited(s, 0);
  if (s->clients_len < s->config.min_clients) start_waiting_for_members(s, now);
  /* nobody reported the model loaded: no round (nobody could train it), the run waits for members again */
  else if (timed_out(s, now, s->config.warmup_time)) {
    if (s->warmup_len == 0) start_waiting_for_members(s, now);
    else start_round_train(s, now);
  }
}

static void start_cooldown(State *s, u64 now) {
  change_state(s, now, COOLDOWN);
}

/* allAttested (machine.ts): every witness attested every trainer. With max_trainers_per_round below the roster, once
 * every witness has sent its proof: the shuffle the round's close runs anyway (extras_progress, which then follows the
 * chosen positions) names the chosen trainers, and each must be in every proof (roster_mark counts the proofs). */
static int all_attested(const State *s, Round *r) {
  u64 n = r->roster_len, w = witness_count(s, n), t = r->trainers;
  if (t == n) return r->complete_witnesses >= w;
  if (r->witness_len < w || t > r->batch_size) return 0;
  extras_progress(s, r, SHUFFLE_ROUNDS);
  for (u64 k = 0; k < t; k++)
    if ((u64)(r->roster_mark[r->extra_at[k]] & ~MARK_EXCLUDED) < w) return 0;
  return 1;
}

static void tick_round_witness(State *s, u64 now) {
  Round *r = &s->round;
  /* The window is the upper bound; it closes as soon as every witness attested every trainer (allAttested). */
  if (!timed_out(s, now, s->config.round_witness_time) && !all_attested(s, r)) return;
  credit_round(s, r);
  s->progress_step++;
  move_exited(s, r->height);
  u64 witnessed = r->witness_len;
  if (witnessed == 0) {
    for (u64 i = 0; i < s->clients_len; i++) s->clients[i].state = WITHDRAWN;
    start_cooldown(s, now);
    return;
  }
  int epoch_over = now >= s->epoch_start_time + s->config.epoch_time * 1000 ||
                   (s->config.rounds_per_epoch != 0 && r->height + 1 >= s->config.rounds_per_epoch);
  if (epoch_over || s->clients_len < s->config.min_clients || witnessed < witness_quorum(witness_count(s, r->roster_len)) ||
      s->progress_step > s->config.total_steps || s->pending_pause) {
    start_cooldown(s, now);
    return;
  }
  start_round_train(s, now);
}

static const u8 *agreed_param_hash(const State *s);

/* modelAtEpochEnd (machine.ts): the run's model at an epoch's end (in its Cooldown) is the last round's step with the hash
 * its witnesses agreed on, none when no quorum did; an epoch whose only round no witness attested keeps the model it
 * began with (its hash, at the new step). */
static void record_model(State *s) {
  if (!s->has_round) return;
  const u8 *agreed = agreed_param_hash(s);
  if (!agreed && s->round.height == 0 && s->round.witness_len == 0) {
    if (s->has_current_model) s->current_model_step = s->round.step;
    return;
  }
  s->has_current_model = 1;
  s->current_model_step = s->round.step;
  s->has_current_model_hash = agreed != NULL;
  if (agreed) copy(s->current_model_hash, agreed, 32);
  else zero(s->current_model_hash, 32);
}

static void tick_cooldown(State *s, u64 now) {
  if (!timed_out(s, now, s->config.cooldown_time) && !s->checkpointed) return;
  record_model(s);
  move_exited(s, current_height(s));
  checkpoint_to_p2p(s);
  settle_epoch(s);
  s->progress_epoch++;
  s->epoch_start_data_index = next_data_index(s);
  if (s->pending_pause) {
    s->pending_pause = 0;
    s->cold_start = 1;
    keep_healthy_as_pending(s);
    change_state(s, now, PAUSED);
    forget_scores(s);
    return;
  }
  s->cold_start = 0;
  start_waiting_for_members(s, now);
  forget_scores(s);
}

static u64 on_tick(State *s, u64 now) {
  switch (s->run_state) {
    case WAITING_FOR_MEMBERS: tick_waiting_for_members(s, now); return 0;
    case WARMUP: tick_warmup(s, now); return 0;
    case ROUND_TRAIN:
      if (timed_out(s, now, s->config.max_round_train_time)) change_state(s, now, ROUND_WITNESS);
      return 0;
    case ROUND_WITNESS: tick_round_witness(s, now); return 0;
    case COOLDOWN: tick_cooldown(s, now); return 0;
    default: return fail(E_HALTED, "the run is halted: nothing to tick");
  }
}

/* ---- events ---- */

static u64 on_join(State *s, const u8 *key) {
  if (s->run_state == FINISHED) return fail(E_HALTED, "the run is Finished");
  if (pending_index(s, key) >= 0) return fail(E_ALREADY_JOINED, "this client is already waiting to join");
  i64 i = client_index(s, key);
  if (i >= 0 && s->clients[i].state == HEALTHY && s->run_state != WAITING_FOR_MEMBERS && !HALTED(s->run_state))
    return fail(E_ALREADY_JOINED, "this client is already training in this epoch");
  /* An ejected client sits out the rest of its epoch and the whole next one: the epoch's record of who left
     (clients and exited, kept until the next epoch's Warmup) is the ban list (machine.ts onJoin). */
  int ejected = i >= 0 && s->clients[i].state == EJECTED;
  for (u64 j = 0; j < s->exited_len && !ejected; j++) ejected = equal(s->exited[j].key, key, 32) && s->exited[j].state == EJECTED;
  if (ejected) return fail(E_BANNED, "this client was ejected from the current or last epoch; it may join once the next epoch has begun");
  int carried = i >= 0 && s->clients[i].state == HEALTHY;
  if (!carried && next_epoch_size(s) >= MAX_CLIENTS)
    return fail(E_CAPACITY_EXCEEDED, "the run is full: MAX_CLIENTS = " STR(MAX_CLIENTS) " clients and joiners for the next epoch");
  u64 p = s->pending_len++;
  copy(s->pending[p], key, 32);
  s->pending_probe[p] = participant_probe(key);
  s->pending_client[p] = i >= 0 ? (u64)i + 1 : 0;
  s->pending_ledger[p] = ledger_slot(s, key);
  return 0;
}

static u64 on_withdraw(State *s, const u8 *key, u64 eject) {
  i64 p = pending_index(s, key);
  if (p >= 0) remove_pending(s, (u64)p);
  i64 i = client_index(s, key);
  int in_epoch = i >= 0 && s->clients[i].state == HEALTHY && (eject || s->run_state == WARMUP || ACTIVE(s->run_state));
  if (in_epoch) {
    s->clients[i].state = eject ? EJECTED : WITHDRAWN;
    return 0;
  }
  if (p >= 0) return 0;
  return eject ? fail(E_UNKNOWN_CLIENT, "this client is neither training nor waiting to join")
               : fail(E_INVALID_WITHDRAW, "this client is neither training nor waiting to join");
}

/* Witness proofs: in Warmup "model loaded" (blooms ignored), in a round the witness's blooms. */
static u64 on_witness(State *s, u64 now, const u8 *key, const u8 *data, u64 len) {
  if (HALTED(s->run_state)) return fail(E_HALTED, "the run is halted");
  if (s->run_state == WARMUP) {
    i64 i = client_index(s, key);
    if (i < 0 || s->clients[i].state != HEALTHY) return fail(E_INVALID_WITNESS, "this client is not in this epoch");
    for (u64 j = 0; j < s->warmup_len; j++)
      if (equal(s->warmup_witnesses[j], key, 32)) return fail(E_DUPLICATE_WITNESS, "this client already reported in Warmup");
    copy(s->warmup_witnesses[s->warmup_len++], key, 32);
    if (s->warmup_len >= witness_count(s, s->clients_len)) start_round_train(s, now);
    return 0;
  }
  if (s->run_state != ROUND_TRAIN && s->run_state != ROUND_WITNESS)
    return fail(E_INVALID_RUN_STATE, "witness proofs are accepted in Warmup, RoundTrain and RoundWitness");
  /* data: step u64, bloom length u16, participant bloom, broadcast bloom */
  if (len < 10) return fail(E_INVALID_INSTRUCTION, "witness: expected step and blooms");
  Round *r = &s->round;
  if (read_u64(data) != r->step) return fail(E_WRONG_STEP, "witness proof for another step than the round's");
  if (!is_witness(s, r, key)) return fail(E_INVALID_WITNESS, "this client is not a witness of the round");
  for (u64 w = 0; w < r->witness_len; w++)
    if (equal(r->witnesses[w].from, key, 32)) return fail(E_DUPLICATE_WITNESS, "this client already sent a proof for the round");
  u64 bytes = BLOOM_BITS[bloom_size(r) - 1] / 8;
  if (read_u16(data + 8) != bytes || len != 10 + 2 * bytes) return fail(E_INVALID_WITNESS, "bloom filters of the wrong size for the round");
  if (r->witness_len >= MAX_WITNESSES) return fail(E_CAPACITY_EXCEEDED, "the round already holds MAX_WITNESSES = " STR(MAX_WITNESSES) " proofs");
  Witness *w = &r->witnesses[r->witness_len++];
  copy(w->from, key, 32);
  copy(w->participant_bloom, data + 10, bytes);
  copy(w->broadcast_bloom, data + 10 + bytes, bytes);
  if (mark_witnessed(s, r, w->participant_bloom)) r->complete_witnesses++;
  extras_slice(s, r);
  if (s->run_state == ROUND_TRAIN && r->witness_len >= witness_quorum(witness_count(s, r->roster_len))) change_state(s, now, ROUND_WITNESS);
  return 0;
}

/* data: count u8, then count public keys. */
static u64 on_health_check(State *s, const u8 *key, const u8 *data, u64 len) {
  if (HALTED(s->run_state)) return fail(E_HALTED, "the run is halted");
  if (s->run_state != ROUND_TRAIN && s->run_state != ROUND_WITNESS) return fail(E_INVALID_RUN_STATE, "health checks are accepted during rounds");
  if (!s->has_previous_round) return fail(E_NO_ACTIVE_ROUND, "no finished round in this epoch to judge yet");
  i64 reporter = client_index(s, key);
  if (reporter < 0 || s->clients[reporter].state != HEALTHY) return fail(E_INVALID_HEALTH_CHECK, "the reporter is not a healthy client of this epoch");
  if (len < 1 || data[0] == 0) return fail(E_INVALID_HEALTH_CHECK, "a health check must accuse at least one client");
  u64 n = data[0];
  if (len != 1 + 32 * n) return fail(E_INVALID_INSTRUCTION, "health_check: expected count and public keys");
  const Round *judged = &s->previous_round;
  for (u64 a = 0; a < n; a++) {
    const u8 *accused = data + 1 + 32 * a;
    i64 index = roster_index(judged, accused);
    if (index < 0) return fail(E_INVALID_HEALTH_CHECK, "an accused client did not train in the judged step");
    u64 start, end;
    batch_range(s, judged, (u64)index, &start, &end);
    if (start == end) return fail(E_INVALID_HEALTH_CHECK, "an accused client had no batches in the judged step");
    if (trainer_healthy(s, judged, judged->roster_probe[index])) return fail(E_INVALID_HEALTH_CHECK, "an accused client is healthy: a witness quorum saw its results");
  }
  for (u64 a = 0; a < n; a++) {
    i64 i = client_index(s, data + 1 + 32 * a);
    if (i >= 0 && s->clients[i].state == HEALTHY) s->clients[i].state = DROPPED;
  }
  return 0;
}

/* accuse data: step u64, accused key, reason u8 (0: invalid_result, by a witness; 1: low_score, by a
 * verifier assigned to score the accused). A quorum of the round's witnesses (resp. those verifiers) accusing the same trainer for the same
 * reason ejects it and excludes its result from the round (onAccuse). */
static u64 on_accuse(State *s, const u8 *key, const u8 *data, u64 len) {
  if (s->run_state != ROUND_TRAIN && s->run_state != ROUND_WITNESS) return fail(E_INVALID_RUN_STATE, "accusations are accepted during rounds");
  if (len != 8 + 32 + 1) return fail(E_INVALID_INSTRUCTION, "accuse: expected step, accused key and reason");
  Round *r = &s->round;
  const u8 *accused = data + 8;
  if (read_u64(data) != r->step) return fail(E_WRONG_STEP, "accusation for another step than the round's");
  u64 reason = data[40];
  if (reason != REASON_INVALID_RESULT && reason != REASON_LOW_SCORE) return fail(E_INVALID_ACCUSATION, "unknown accusation reason");
  if (reason == REASON_INVALID_RESULT && !is_witness(s, r, key)) return fail(E_INVALID_ACCUSATION, "the accuser is not a witness of the round");
  /* a low score: only a verifier the seed assigned to score the accused (score_assigned, below) */
  if (equal(key, accused, 32)) return fail(E_INVALID_ACCUSATION, "a client cannot accuse itself");
  i64 index = roster_index(r, accused);
  u64 start = 0, end = 0;
  if (index >= 0) batch_range(s, r, (u64)index, &start, &end);
  if (start == end) return fail(E_INVALID_ACCUSATION, "the accused has no batches in the round, so no result to accuse");
  u64 assigned = 0;
  if (reason == REASON_LOW_SCORE && !score_assigned(s, r, key, accused, &assigned))
    return fail(E_INVALID_ACCUSATION, "the accuser was not assigned to score the accused's result of the previous round");
  u64 backing = 1;
  for (u64 a = 0; a < r->accusation_len; a++) {
    if (r->accusations[a].reason != reason || !equal(r->accusations[a].accused, accused, 32)) continue;
    if (equal(r->accusations[a].from, key, 32)) return fail(E_DUPLICATE_ACCUSATION, "this client already accused that client for that reason in this round");
    backing++;
  }
  if (r->accusation_len >= MAX_ACCUSATIONS) return fail(E_CAPACITY_EXCEEDED, "the round already holds MAX_ACCUSATIONS = " STR(MAX_ACCUSATIONS) " accusations");
  Accusation *x = &r->accusations[r->accusation_len++];
  copy(x->from, key, 32);
  copy(x->accused, accused, 32);
  x->reason = reason;
  /* a low score: witness_quorum over the verifiers assigned to the accused (1 of 1, 2 of 2 or 3, ...) */
  u64 judges = reason == REASON_LOW_SCORE ? assigned : witness_count(s, r->roster_len);
  if (backing < witness_quorum(judges)) return 0;
  int excluded = 0;
  for (u64 e = 0; e < r->excluded_len; e++)
    if (equal(r->excluded[e], accused, 32)) excluded = 1;
  if (!excluded) copy(r->excluded[r->excluded_len++], accused, 32); /* excluded_len < MAX_CLIENTS: roster members only */
  r->roster_mark[index] |= MARK_EXCLUDED;
  i64 i = client_index(s, accused);
  if (i >= 0 && s->clients[i].state == HEALTHY) s->clients[i].state = EJECTED;
  return 0;
}

/* ---- verifier scores (rewards.ts recordScores) ---- */

/* The ledger's one rounding (rewards.ts divTrunc): division truncating toward zero, in unsigned arithmetic (sBPF v0
 * has no signed division). */
static i64 div_trunc(i64 a, u64 b) {
  u64 q = (a < 0 ? (u64)0 - (u64)a : (u64)a) / b;
  return a < 0 ? -(i64)q : (i64)q;
}

/* One score of a step into a client's moving average (recordScores): a later step starts a new mean (the previous
 * one is final in the average), the same step adds to its mean, an older one is ignored; the average is
 * trunc((before + mean) / 2), or the mean for the first step scored. */
static void take_score(Points *e, u64 step, i64 score) {
  if (e->count == 0 || step > e->last_step) {
    e->has_before = e->count != 0;
    e->before = e->score;
    e->sum = score;
    e->verifiers = 1;
    e->last = score;
    e->last_step = step;
  } else if (step == e->last_step) {
    e->sum += score;
    e->verifiers++;
    e->last = div_trunc(e->sum, e->verifiers);
  } else {
    return;
  }
  e->count++;
  e->score = e->has_before ? div_trunc(e->before + e->last, 2) : e->last;
}

/*
 * report_scores data: the scored step u64, then entries of the scored round's roster index u16 and score i32 (fixed
 * point, SCORE_ONE = 1), at most REPORT_SCORES_MAX. A verifier of round s + 1 (the current round) reports its scores
 * of round s's results (the previous round), once, for trainers isScoreAssigned gives it (rules.ts: the verifier's
 * window of shuffled positions); refused whole otherwise (InvalidScores, DuplicateScores, WrongStep: stale). A trainer
 * listed twice counts once. Costs a shuffle for the verifier and one per distinct trainer (and one for its batch range
 * when the scored round had fewer batches than trainers): a report naming more trainers than the window holds is
 * refused before any.
 */
static u64 on_report_scores(State *s, const u8 *key, const u8 *data, u64 len) {
  if (s->run_state != ROUND_TRAIN && s->run_state != ROUND_WITNESS) return fail(E_INVALID_RUN_STATE, "scores are accepted during rounds");
  if (len < 8 || (len - 8) % 6 != 0 || (len - 8) / 6 > REPORT_SCORES_MAX)
    return fail(E_INVALID_INSTRUCTION, "report_scores: expected the step and at most " STR(REPORT_SCORES_MAX) " entries (roster index u16, score i32)");
  u64 step = read_u64(data);
  u64 k = (len - 8) / 6;
  const u8 *entries = data + 8;
  Round *r = &s->round, *p = &s->previous_round;
  if (!s->has_round || !s->has_previous_round || r->step != step + 1 || p->step != step) return fail(E_WRONG_STEP, "scores for a step other than the previous round's");
  u64 n = r->roster_len, v = verifier_count(s, n);
  u8 seed[32];
  sub_seed(r->seed, "verify", seed);
  i64 vi = roster_index(r, key);
  u64 j = vi < 0 ? n : shuffle_index((u64)vi, n, seed, 0);
  if (j >= v) return fail(E_INVALID_SCORES, "the reporter is not a verifier of the round");
  for (u64 e = 0; e < k; e++) {
    i64 score = (i64)(int)read_u32(entries + 6 * e + 2);
    if (score < -(i64)SCORE_ONE || score > (i64)SCORE_ONE) return fail(E_INVALID_SCORES, "a score outside [-SCORE_ONE, SCORE_ONE]");
  }
  /* the window (in_score_window): K = min(sample, n - 1) positions, one more where it steps over the verifier */
  u64 slot = j * n / v, sample = VERIFICATION_SAMPLE < n - 1 ? VERIFICATION_SAMPLE : n - 1, self = (j + n - slot) % n;
  u64 size = self >= 1 && self <= sample ? sample + 1 : sample;
  u64 distinct = 0;
  for (u64 e = 0; e < k; e++) {
    u64 index = read_u16(entries + 6 * e);
    int repeated = 0;
    for (u64 f = 0; f < e && !repeated; f++) repeated = read_u16(entries + 6 * f) == index;
    if (repeated) continue;
    if (++distinct > size || index >= p->roster_len) return fail(E_INVALID_SCORES, "a scored trainer the reporter was not assigned");
    const u8 *trainer = p->roster[index];
    i64 ti = equal(trainer, key, 32) ? -1 : roster_index(r, trainer);
    if (ti < 0 || !in_score_window(j, shuffle_index((u64)ti, n, seed, 0), n, v)) return fail(E_INVALID_SCORES, "a scored trainer the reporter was not assigned");
    u64 start = 0, end = 1; /* every member has a batch when all train and there are as many batches as members */
    if (p->batch_size < p->roster_len || p->trainers < p->roster_len) batch_range(s, p, index, &start, &end);
    if (end <= start) return fail(E_INVALID_SCORES, "a scored trainer had no batches in the scored round");
  }
  if (r->scores_reported[vi >> 3] & (1 << (vi & 7))) return fail(E_DUPLICATE_SCORES, "this verifier already reported its scores of that step");
  r->scores_reported[vi >> 3] |= (u8)(1 << (vi & 7));
  for (u64 e = 0; e < k; e++) {
    u64 index = read_u16(entries + 6 * e);
    int repeated = 0;
    for (u64 f = 0; f < e && !repeated; f++) repeated = read_u16(entries + 6 * f) == index;
    u64 entry = p->roster_ledger[index];
    if (!repeated && entry) take_score(&s->ledger[entry - 1], step, (i64)(int)read_u32(entries + 6 * e + 2));
  }
  return 0;
}

static u64 on_pause(State *s, u64 now) {
  if (HALTED(s->run_state)) return fail(E_HALTED, "the run is already halted");
  if (ACTIVE(s->run_state)) {
    s->pending_pause = 1;
    return 0;
  }
  keep_healthy_as_pending(s);
  change_state(s, now, PAUSED);
  return 0;
}

static u64 on_resume(State *s, u64 now) {
  if (s->run_state != PAUSED && s->run_state != UNINITIALIZED) return fail(E_CANNOT_RESUME, "the run is not Paused");
  if (!s->has_config) return fail(E_INVALID_CONFIG, "the run has no configuration yet: send update first");
  change_state(s, now, s->progress_step > s->config.total_steps ? FINISHED : WAITING_FOR_MEMBERS);
  return 0;
}

/* data: repo length u8, repo, revision flag u8, revision length u8, revision */
static u64 read_repo(Checkpoint *c, const u8 *data, u64 len) {
  if (len < 3) return fail(E_INVALID_INSTRUCTION, "expected a repo");
  u64 repo_len = data[0];
  if (repo_len > REPO_MAX || len < 3 + repo_len) return fail(E_INVALID_EVENT, "repo_id longer than 96 bytes");
  u64 has_revision = data[1 + repo_len];
  u64 revision_len = data[2 + repo_len];
  if (revision_len > REVISION_MAX || len != 3 + repo_len + revision_len || has_revision > 1 || (!has_revision && revision_len))
    return fail(E_INVALID_EVENT, "malformed revision (at most 64 bytes)");
  c->repo_len = (u8)repo_len;
  copy(c->repo, data + 1, repo_len);
  zero(c->repo + repo_len, REPO_MAX - repo_len);
  c->has_revision = (u8)has_revision;
  c->revision_len = (u8)revision_len;
  copy(c->revision, data + 3 + repo_len, revision_len);
  zero(c->revision + revision_len, REVISION_MAX - revision_len);
  return 0;
}

/* Cooldown's witness (onHashWitness): a witness of the epoch's last round, still in the epoch, attests the hash of its
 * parameters after applying that round. data: step u64, param_hash (32 bytes). */
static u64 on_hash_witness(State *s, const u8 *key, const u8 *data, u64 len) {
  if (HALTED(s->run_state)) return fail(E_HALTED, "the run is halted");
  if (s->run_state != COOLDOWN) return fail(E_INVALID_RUN_STATE, "parameter hashes are attested in Cooldown");
  if (len != 40) return fail(E_INVALID_INSTRUCTION, "hash_witness: expected step and a 32-byte hash");
  if (!s->has_round) return fail(E_NO_ACTIVE_ROUND, "this epoch had no round to attest");
  Round *r = &s->round;
  if (read_u64(data) != r->step) return fail(E_WRONG_STEP, "parameter hash for another step than the epoch's last round");
  i64 i = client_index(s, key);
  if (i < 0 || s->clients[i].state != HEALTHY || !is_witness(s, r, key))
    return fail(E_INVALID_WITNESS, "this client is not a witness of the epoch's last round still in the epoch");
  for (u64 w = 0; w < s->hash_witness_len; w++)
    if (equal(s->hash_witnesses[w].from, key, 32)) return fail(E_DUPLICATE_WITNESS, "this client already attested the parameters");
  if (s->hash_witness_len >= MAX_WITNESSES) return fail(E_CAPACITY_EXCEEDED, "MAX_WITNESSES parameter hashes already attested");
  HashWitness *h = &s->hash_witnesses[s->hash_witness_len++];
  copy(h->from, key, 32);
  copy(h->param_hash, data + 8, 32);
  return 0;
}

/* The hash a quorum of the last round's witnesses attested (agreedParamHash): the first to reach it, or NULL. */
static const u8 *agreed_param_hash(const State *s) {
  if (s->run_state != COOLDOWN || !s->has_round) return NULL;
  u64 quorum = witness_quorum(witness_count(s, s->round.roster_len));
  if (quorum == 0) return NULL;
  for (u64 i = 0; i < s->hash_witness_len; i++) {
    u64 n = 0;
    for (u64 j = 0; j <= i; j++)
      if (equal(s->hash_witnesses[j].param_hash, s->hash_witnesses[i].param_hash, 32)) n++;
    if (n >= quorum) return s->hash_witnesses[i].param_hash;
  }
  return NULL;
}

/* data: has_hash u8, param_hash (32 bytes, zeros without), then the repo (read_repo). In Cooldown, of the hash the
 * epoch's last round's witnesses agreed on; in any other phase ("late"), only of the run's current model (its hash
 * recorded at the last epoch's end), once, and then a designated checkpointer needs no membership (onCheckpoint). */
static u64 on_checkpoint(State *s, const u8 *key, const u8 *data, u64 len) {
  int late = s->run_state != COOLDOWN;
  if (late && !(s->has_current_model && s->has_current_model_hash))
    return fail(E_INVALID_RUN_STATE, "checkpoints are reported in Cooldown (outside it only of the run's current model, whose hash no epoch recorded)");
  if (!(late && s->checkpointers_len) && client_index(s, key) < 0) return fail(E_UNKNOWN_CLIENT, "this client is not in this epoch");
  if (s->checkpointers_len) {
    u64 c = 0;
    while (c < s->checkpointers_len && !equal(s->checkpointers[c], key, 32)) c++;
    if (c == s->checkpointers_len) return fail(E_NOT_CHECKPOINTER, "this client is not one of the run's checkpointers (config.checkpointers)");
  }
  if (late ? s->has_checkpoint_hash && equal(s->checkpoint_hash, s->current_model_hash, 32) : s->checkpointed)
    return fail(E_ALREADY_CHECKPOINTED, late ? "the run's current model is already checkpointed" : "this epoch is already checkpointed");
  if (len < 33 || data[0] > 1) return fail(E_INVALID_INSTRUCTION, "checkpoint: expected a hash flag, a hash and a repo");
  Checkpoint repo;
  u64 e = read_repo(&repo, data + 33, len - 33);
  if (e) return e;
  if (repo.repo_len == 0) return fail(E_INVALID_EVENT, "checkpoint repo_id must be a non-empty string");
  const u8 *agreed = late ? s->current_model_hash : agreed_param_hash(s);
  if (!agreed) return fail(E_HASH_NOT_AGREED, "no quorum of the last round's witnesses has attested a parameter hash yet");
  if (!data[0] || !equal(data + 1, agreed, 32)) return fail(E_CHECKPOINT_HASH_MISMATCH, "the checkpoint's parameter hash is not the one the witnesses agreed on");
  repo.kind = CK_HUB;
  s->has_checkpoint_hash = 1;
  s->checkpoint_hash_step = late ? s->current_model_step : s->round.step;
  copy(s->checkpoint_hash, agreed, 32);
  copy(&s->checkpoint_hash_repo, &repo, sizeof(Checkpoint));
  u8 kind = s->checkpoint.kind;
  copy(&s->checkpoint_fallback, &repo, sizeof(Checkpoint));
  /* the model now lives in that repository: it replaces a Hub or Dummy starting point too (the reference's onCheckpoint) */
  if (kind == CK_P2P || kind == CK_HUB || kind == CK_DUMMY) {
    copy(&s->checkpoint, &repo, sizeof(Checkpoint));
    s->checkpoint.kind = kind == CK_P2P ? CK_P2P : CK_HUB;
  }
  if (!late) s->checkpointed = 1; /* a late checkpoint ends no Cooldown */
  return 0;
}

/* The cross-field rules of validateRunConfig that concern the coordinator (the client validates the rest). */
/* The reference's LIMITS (src/core/config/run-config.ts): a week for every duration, u16 client counts and batch
 * sizes, u32 step counts, 2^20 tokens per sample. */
#define LIMIT_SECONDS (7 * 24 * 3600)
#define LIMIT_BATCH 65535
#define LIMIT_STEPS 0xffffffffull
#define LIMIT_SEQ_LEN (1 << 20)
/* SPARSELOCO_LIMITS.innerSteps: SparseLoCo's inner steps per round (every other optimizer has 1) */
#define LIMIT_INNER_STEPS 10000

static u64 validate_config(const Config *c, u64 max_seq_len, u64 cold_start, u64 inner_steps) {
  if (c->warmup_time > LIMIT_SECONDS || c->cooldown_time > LIMIT_SECONDS || c->epoch_time > LIMIT_SECONDS || c->max_round_train_time > LIMIT_SECONDS ||
      c->round_witness_time > LIMIT_SECONDS || c->waiting_for_members_extra_time > LIMIT_SECONDS)
    return fail(E_INVALID_CONFIG, "every duration must be at most a week (604800 s)");
  if (c->global_batch_size_start > LIMIT_BATCH || c->global_batch_size_end > LIMIT_BATCH) return fail(E_INVALID_CONFIG, "global batch sizes must be at most 65535");
  if (c->total_steps > LIMIT_STEPS || c->rounds_per_epoch > LIMIT_STEPS || cold_start > LIMIT_STEPS) return fail(E_INVALID_CONFIG, "step counts must be at most 2^32 - 1");
  if (max_seq_len > LIMIT_SEQ_LEN) return fail(E_INVALID_CONFIG, "max_seq_len must be at most 2^20");
  if (inner_steps < 1 || inner_steps > LIMIT_INNER_STEPS) return fail(E_INVALID_CONFIG, "inner_steps (model.LLM.optimizer.SparseLoCo) must be 1 to 10000");
  if (c->cooldown_time < 1 || c->epoch_time < 1 || c->max_round_train_time < 1 || c->round_witness_time < 1)
    return fail(E_INVALID_CONFIG, "cooldown_time, epoch_time, max_round_train_time and round_witness_time must be >= 1");
  if (c->min_clients < 1 || c->init_min_clients < c->min_clients) return fail(E_INVALID_CONFIG, "need 1 <= min_clients <= init_min_clients");
  if (c->init_min_clients > MAX_CLIENTS) return fail(E_INVALID_CONFIG, "init_min_clients exceeds MAX_CLIENTS = " STR(MAX_CLIENTS));
  if (c->witness_nodes > MAX_WITNESSES) return fail(E_INVALID_CONFIG, "witness_nodes exceeds MAX_WITNESSES = " STR(MAX_WITNESSES));
  if (c->witness_nodes > c->min_clients) return fail(E_INVALID_CONFIG, "witness_nodes must be <= min_clients, or 0 for automatic");
  if (c->verification_percent > 100) return fail(E_INVALID_CONFIG, "verification_percent must be <= 100");
  /* credit_round follows the chosen trainers' positions: at most MAX_CLIENTS / 2, as for the members with one batch more */
  if (c->max_trainers_per_round > MAX_CLIENTS / 2) return fail(E_INVALID_CONFIG, "max_trainers_per_round exceeds MAX_CLIENTS / 2 = 128");
  if (c->global_batch_size_start < c->init_min_clients || c->global_batch_size_end < c->global_batch_size_start)
    return fail(E_INVALID_CONFIG, "need init_min_clients <= global_batch_size_start <= global_batch_size_end");
  if (c->global_batch_size_start != c->global_batch_size_end && c->global_batch_size_warmup_tokens == 0)
    return fail(E_INVALID_CONFIG, "global_batch_size_warmup_tokens must be > 0 when the batch size ramps");
  if (c->total_steps < 1 || max_seq_len < 1) return fail(E_INVALID_CONFIG, "total_steps and max_seq_len must be >= 1");
  if ((c->global_batch_size_warmup_tokens + max_seq_len - 1) / max_seq_len > c->total_steps * c->global_batch_size_end)
    return fail(E_INVALID_CONFIG, "global_batch_size_warmup_tokens exceeds the whole run's tokens");
  if (c->epoch_time < c->max_round_train_time + c->round_witness_time) return fail(E_INVALID_CONFIG, "epoch_time must fit one round");
  if (cold_start > c->total_steps) return fail(E_INVALID_CONFIG, "cold_start_warmup_steps must be <= total_steps");
  return 0;
}

/*
 * update data: has_config u8, Config (128 bytes), checkpointers count u8 and as many public keys (config.checkpointers,
 * with the config; 0: none), has_model u8, then if has_model: max_seq_len u64, cold_start_warmup_steps u64, inner_steps
 * u64 (SparseLoCo's, 1 for every other optimizer; not in the JSON), checkpoint kind u8, repo (read_repo), model JSON
 * length u16, JSON.
 */
static u64 on_update(State *s, const u8 *data, u64 len) {
  if (s->run_state != PAUSED && s->run_state != UNINITIALIZED)
    return fail(E_INVALID_RUN_STATE, "the configuration can change only while Paused or Uninitialized");
  if (len < 3 + sizeof(Config)) return fail(E_INVALID_INSTRUCTION, "update: expected config and model");
  Config config;
  if (data[0]) copy(&config, data + 1, sizeof(Config));
  else if (s->has_config) copy(&config, &s->config, sizeof(Config));
  else return fail(E_INVALID_CONFIG, "the first update must set the configuration");
  u64 checkpointers = data[1 + sizeof(Config)];
  const u8 *keys = data + 2 + sizeof(Config);
  if (len < 3 + sizeof(Config) + 32 * checkpointers) return fail(E_INVALID_INSTRUCTION, "update: checkpointers too short");
  if (checkpointers && !data[0]) return fail(E_INVALID_INSTRUCTION, "update: checkpointers come with the config");
  if (checkpointers > MAX_CHECKPOINTERS) return fail(E_INVALID_CONFIG, "config.checkpointers: at most MAX_CHECKPOINTERS client ids");
  for (u64 i = 0; i < checkpointers; i++)
    for (u64 j = 0; j < i; j++)
      if (equal(keys + 32 * i, keys + 32 * j, 32)) return fail(E_INVALID_CONFIG, "config.checkpointers names a client twice");
  const u8 *m = keys + 32 * checkpointers;
  u64 rest = len - 2 - sizeof(Config) - 32 * checkpointers;
  u64 max_seq_len = s->max_seq_len, cold_start = s->cold_start_warmup_steps, inner_steps = s->inner_steps;
  Checkpoint checkpoint;
  copy(&checkpoint, &s->checkpoint, sizeof(Checkpoint));
  u64 json_len = 0;
  const u8 *json = NULL;
  if (m[0]) {
    if (rest < 1 + 25 + 3 + 2) return fail(E_INVALID_INSTRUCTION, "update: model too short");
    max_seq_len = read_u64(m + 1);
    cold_start = read_u64(m + 9);
    inner_steps = read_u64(m + 17);
    u8 kind = m[25];
    if (kind != CK_DUMMY && kind != CK_HUB && kind != CK_P2P)
      return fail(E_INVALID_CONFIG, "model.LLM.checkpoint must be Hub, P2P or Dummy on Solana (Ephemeral cannot start a run)");
    u64 repo_bytes = 3 + m[26] + m[26 + 2 + m[26]];
    if (26 + repo_bytes + 2 > rest) return fail(E_INVALID_INSTRUCTION, "update: model too short");
    u64 e = read_repo(&checkpoint, m + 26, repo_bytes);
    if (e) return e;
    checkpoint.kind = kind;
    json_len = (u64)m[26 + repo_bytes] | ((u64)m[27 + repo_bytes] << 8);
    json = m + 28 + repo_bytes;
    if (json_len > MODEL_JSON_MAX) return fail(E_CAPACITY_EXCEEDED, "model JSON exceeds MODEL_JSON_MAX = 4096 bytes");
    if (28 + repo_bytes + json_len != rest) return fail(E_INVALID_INSTRUCTION, "update: model JSON length mismatch");
  } else if (rest != 1) return fail(E_INVALID_INSTRUCTION, "update: trailing bytes");
  else if (!s->has_config) return fail(E_INVALID_CONFIG, "the first update must set the model");
  /* readHubRepo, on the checkpoint the run will have (the new one, or the one it has: the reference validates the
   * whole model either way): a revision, when given, is not empty; Hub and P2P name a repo (Dummy may not; a Dummy
   * run's epoch end turns it into P2P) */
  if (checkpoint.has_revision && !checkpoint.revision_len) return fail(E_INVALID_CONFIG, "model.LLM.checkpoint: the revision must not be empty");
  if (checkpoint.kind != CK_DUMMY && !checkpoint.repo_len) return fail(E_INVALID_CONFIG, "model.LLM.checkpoint: repo_id must not be empty");
  u64 e = validate_config(&config, max_seq_len, cold_start, inner_steps);
  if (e) return e;
  copy(&s->config, &config, sizeof(Config));
  if (data[0]) {
    s->checkpointers_len = checkpointers;
    zero(s->checkpointers, sizeof(s->checkpointers));
    copy(s->checkpointers, keys, 32 * checkpointers);
  }
  s->has_config = 1;
  s->max_seq_len = max_seq_len;
  s->cold_start_warmup_steps = cold_start;
  s->inner_steps = inner_steps;
  copy(&s->checkpoint, &checkpoint, sizeof(Checkpoint));
  if (json) {
    s->model_json_len = json_len;
    copy(s->model_json, json, json_len);
    zero(s->model_json + json_len, MODEL_JSON_MAX - json_len);
  }
  return 0;
}


/* ---- equivocation proofs (onEquivocation, verify/equivocation.ts) ---- */

/* Sysvar1nstructions1111111111111111111111111 and Ed25519SigVerify111111111111111111111111111 */
static const u8 SYSVAR_INSTRUCTIONS[32] = {0x06, 0xa7, 0xd5, 0x17, 0x18, 0x7b, 0xd1, 0x66, 0x35, 0xda, 0xd4, 0x04, 0x55, 0xfd, 0xc2, 0xc0,
                                           0xc1, 0x24, 0xc6, 0x8f, 0x21, 0x56, 0x75, 0xa5, 0xdb, 0xba, 0xcb, 0x5f, 0x08, 0x00, 0x00, 0x00};
static const u8 ED25519_PROGRAM[32] = {0x03, 0x7d, 0x46, 0xd6, 0x7c, 0x93, 0xfb, 0xbe, 0x12, 0xf9, 0x42, 0x8f, 0x83, 0x8d, 0x40, 0xff,
                                       0x05, 0x70, 0x74, 0x49, 0x27, 0xf4, 0x8a, 0x64, 0xfc, 0xca, 0x70, 0x44, 0x80, 0x00, 0x00, 0x00};
#define ANNOUNCEMENT_PREFIX_MAX 512


/* The start every announcement of (run, step, producer) signs: DOMAIN + JSON.stringify([run_id, step, client_id, (announcementSigningBytes).
 * Returns its length, or 0 when it does not fit. */
static u64 announcement_prefix(const State *s, u64 step, const u8 *producer, u8 *out) {
  static const char domain[] = "psyche/result-announcement/1\n[\"";
  u64 n = sizeof(domain) - 1;
  copy(out, domain, n);
  for (u64 i = 0; i < s->run_id_len; i++) {
    u8 c = s->run_id[i];
    if (n + 6 > ANNOUNCEMENT_PREFIX_MAX) return 0;
    if (c == '"' || c == '\\') {
      out[n++] = '\\';
      out[n++] = c;
    } else if (c < 0x20) {
      out[n++] = '\\';
      if (c == 8) out[n++] = 'b';
      else if (c == 9) out[n++] = 't';
      else if (c == 10) out[n++] = 'n';
      else if (c == 12) out[n++] = 'f';
      else if (c == 13) out[n++] = 'r';
      else {
        out[n++] = 'u';
        out[n++] = '0';
        out[n++] = '0';
        out[n++] = HEX[c >> 4];
        out[n++] = HEX[c & 15];
      }
    } else out[n++] = c;
  }
  out[n++] = '"';
  out[n++] = ',';
  u8 digits[20];
  u64 nd = 0;
  do {
    digits[nd++] = (u8)('0' + step % 10);
    step /= 10;
  } while (step);
  while (nd) out[n++] = digits[--nd];
  out[n++] = ',';
  out[n++] = '"';
  hex_id(producer, out + n);
  n += 64;
  out[n++] = '"';
  out[n++] = ',';
  return n;
}

/* A JSON safe integer as JSON.stringify writes it (no sign, no leading zero); advances *at past it. */
static int json_uint(const u8 *m, u64 len, u64 *at) {
  u64 start = *at, v = 0;
  while (*at < len && m[*at] >= '0' && m[*at] <= '9') {
    if (*at - start >= 16) return 0;
    v = v * 10 + (m[*at] - '0');
    (*at)++;
  }
  if (*at == start || (m[start] == '0' && *at - start > 1)) return 0;
  return v <= 9007199254740991ull;
}

/* The rest of an announcement after the prefix: batch_start,batch_end,"commitment",size] */
static int announcement_tail(const u8 *m, u64 len) {
  u64 at = 0;
  if (!json_uint(m, len, &at) || at >= len || m[at++] != ',') return 0;
  if (!json_uint(m, len, &at) || at + 68 > len || m[at++] != ',' || m[at++] != '"') return 0;
  for (u64 i = 0; i < 64; i++, at++)
    if (!((m[at] >= '0' && m[at] <= '9') || (m[at] >= 'a' && m[at] <= 'f'))) return 0;
  if (m[at++] != '"' || at >= len || m[at++] != ',') return 0;
  if (!json_uint(m, len, &at)) return 0;
  return at + 1 == len && m[at] == ']';
}

/*
 * checkEquivocation: the instruction right before this one is the Ed25519 program's (the runtime has verified its
 * signatures, or the transaction fails), with exactly two signatures, each by `producer` over a message held in
 * that instruction; both messages are well-formed announcements of this run, step and producer, of different
 * results.
 */
static u64 check_equivocation(Input *in, const State *s, u64 step, const u8 *producer) {
  if (in->account_count < 3 || !equal(in->accounts[2].key, SYSVAR_INSTRUCTIONS, 32)) return fail(E_INVALID_INSTRUCTION, "equivocation: expected the instructions sysvar as the third account");
  const u8 *d = in->accounts[2].data;
  u64 dlen = in->accounts[2].data_len;
  if (dlen < 4) return fail(E_INVALID_PROOF, "equivocation: no instructions");
  u64 count = read_u16(d), current = read_u16(d + dlen - 2);
  if (current == 0 || current >= count || 2 + 2 * count > dlen) return fail(E_INVALID_PROOF, "equivocation: the Ed25519 instruction must come right before");
  u64 at = read_u16(d + 2 + 2 * (current - 1));
  if (at + 2 > dlen) return fail(E_INVALID_PROOF, "equivocation: malformed instructions sysvar");
  at += 2 + read_u16(d + at) * 33;
  if (at + 34 > dlen || !equal(d + at, ED25519_PROGRAM, 32)) return fail(E_INVALID_PROOF, "equivocation: the instruction before is not the Ed25519 program's");
  u64 elen = read_u16(d + at + 32);
  const u8 *e = d + at + 34;
  if (at + 34 + elen > dlen || elen < 2 + 2 * 14 || e[0] != 2) return fail(E_INVALID_PROOF, "equivocation: the Ed25519 instruction must hold exactly two signatures");
  u8 prefix[ANNOUNCEMENT_PREFIX_MAX];
  u64 plen = announcement_prefix(s, step, producer, prefix);
  if (!plen) return fail(E_INVALID_PROOF, "equivocation: the run id is too long to spell");
  const u8 *msgs[2];
  u64 lens[2];
  for (u64 k = 0; k < 2; k++) {
    const u8 *o = e + 2 + 14 * k;
    if (read_u16(o + 2) != 0xffff || read_u16(o + 6) != 0xffff || read_u16(o + 12) != 0xffff)
      return fail(E_INVALID_PROOF, "equivocation: signatures, keys and messages must be in the Ed25519 instruction");
    u64 pk = read_u16(o + 4), mo = read_u16(o + 8), ml = read_u16(o + 10);
    if (pk + 32 > elen || mo + ml > elen) return fail(E_INVALID_PROOF, "equivocation: offsets out of bounds");
    if (!equal(e + pk, producer, 32)) return fail(E_INVALID_PROOF, "equivocation: a signature is not by the accused producer");
    if (ml <= plen || !equal(e + mo, prefix, plen) || !announcement_tail(e + mo + plen, ml - plen))
      return fail(E_INVALID_PROOF, "equivocation: a message is not an announcement of this run, step and producer");
    msgs[k] = e + mo + plen;
    lens[k] = ml - plen;
  }
  if (lens[0] == lens[1] && equal(msgs[0], msgs[1], lens[0])) return fail(E_INVALID_PROOF, "the announcements are of the same result");
  return 0;
}

/* data: step u64, producer key. onEquivocation: a valid proof ejects the producer and excludes it from the round. */
static u64 on_equivocation(Input *in, State *s, const u8 *key, const u8 *data, u64 len) {
  if (s->run_state != WARMUP && !ACTIVE(s->run_state)) return fail(E_INVALID_RUN_STATE, "equivocation proofs are accepted during an epoch");
  if (len != 8 + 32) return fail(E_INVALID_INSTRUCTION, "equivocation: expected step and producer key");
  u64 step = read_u64(data);
  const u8 *producer = data + 8;
  u64 e = check_equivocation(in, s, step, producer);
  if (e) return e;
  if (client_index(s, key) < 0) return fail(E_UNKNOWN_CLIENT, "the reporter is not a client of this epoch");
  i64 i = client_index(s, producer);
  Round *r = s->has_round ? &s->round : NULL;
  int in_round = r && r->step == step && (s->run_state == ROUND_TRAIN || s->run_state == ROUND_WITNESS) && roster_index(r, producer) >= 0;
  if (i < 0 && !in_round) return fail(E_UNKNOWN_CLIENT, "the producer is not in this epoch");
  int excluded = 0;
  if (in_round)
    for (u64 x = 0; x < r->excluded_len; x++)
      if (equal(r->excluded[x], producer, 32)) excluded = 1;
  if (in_round ? excluded : s->clients[i].state == EJECTED) return fail(E_DUPLICATE_ACCUSATION, "the producer is already ejected");
  if (in_round) {
    copy(r->excluded[r->excluded_len++], producer, 32); /* roster members only: excluded_len < MAX_CLIENTS */
    r->roster_mark[roster_index(r, producer)] |= MARK_EXCLUDED;
  }
  if (i >= 0 && s->clients[i].state == HEALTHY) s->clients[i].state = EJECTED;
  return 0;
}

/* ---- instructions ---- */

/* The cluster clock (unix seconds) on the reference's millisecond scale. */
static u64 now_ms(void) {
  SolClock clock;
  sol_get_clock_sysvar(&clock);
  return clock.unix_timestamp < 0 ? 0 : (u64)clock.unix_timestamp * 1000;
}

/* accounts: payer (signer, writable), coordinator PDA (writable), system program.
 * data: run id length u8, run id, main authority, join authority (zeros: anyone may join), authorizer
 * program (whose authorizations from the join authority admit clients), lamports u64 */
static u64 init_coordinator(Input *in) {
  if (in->account_count < 3) return fail(E_INVALID_INSTRUCTION, "init_coordinator: expected payer, coordinator, system program");
  SolAccountInfo *payer = &in->accounts[0], *coord = &in->accounts[1];
  const u8 *d = in->data + 1;
  u64 len = in->data_len - 1;
  if (len < 1 || d[0] == 0 || d[0] > RUN_ID_MAX) return fail(E_INVALID_INSTRUCTION, "run id must be 1 to 32 bytes");
  u64 id_len = d[0];
  if (len != 1 + id_len + 96 + 8) return fail(E_INVALID_INSTRUCTION, "init_coordinator: bad data length");
  if (!payer->is_signer) return fail(E_MISSING_SIGNATURE, "the payer must sign");
  const u8 *run_id = d + 1;
  SolSignerSeed seeds[3] = {{(const u8 *)"coordinator", 11}, {run_id, id_len}, {NULL, 1}};
  u8 address[32], bump;
  if (sol_try_find_program_address(seeds, 2, in->program_id, address, &bump)) return fail(E_WRONG_PROGRAM_ADDRESS, "no program address for this run id");
  if (!equal(address, coord->key, 32)) return fail(E_WRONG_PROGRAM_ADDRESS, "the coordinator account is not the program address of this run id");
  if (equal(coord->owner, in->program_id, 32)) return fail(E_ALREADY_EXISTS, "this run id already has a coordinator account: change it with update, or pick another run id");
  if (!coord->is_writable || !payer->is_writable) return fail(E_NOT_WRITABLE, "the payer and the coordinator account must be writable");
  seeds[2].addr = &bump;
  SolSignerSeeds signer = {seeds, 3};
  /* A program may grow an account by MAX_PERMITTED_DATA_INCREASE per instruction: init_coordinator creates the
   * first 10 KiB, and grow instructions in the same transaction extend it to sizeof(State). */
  Create c = {payer, coord, read_u64(d + 1 + id_len + 96), sizeof(State) < MAX_PERMITTED_DATA_INCREASE ? sizeof(State) : MAX_PERMITTED_DATA_INCREASE, &signer};
  u64 e = create_account(in, &c);
  if (e) return e;
  State *s = (State *)coord->data;
  s->magic = MAGIC;
  s->version = LAYOUT_VERSION;
  copy(s->run_id, run_id, id_len);
  s->run_id_len = id_len;
  s->bump = bump;
  copy(s->main_authority, d + 1 + id_len, 32);
  copy(s->join_authority, d + 1 + id_len + 32, 32);
  copy(s->authorizer, d + 1 + id_len + 64, 32);
  /* seed: SHA-256("psyche/run\0" ‖ run id), as createCoordinator */
  sha256_2((const u8 *)"psyche/run", 11, run_id, id_len, s->seed);
  s->run_state = UNINITIALIZED;
  s->run_state_start = now_ms();
  s->progress_step = 1;
  s->epoch_start_step = 1;
  s->epoch_start_time = s->run_state_start;
  s->first_round = 1;
  return 0;
}

/* accounts: coordinator (writable). Extends it by up to 10 KiB towards sizeof(State), zero-filled. */
static u64 grow(Input *in) {
  if (in->account_count < 1) return fail(E_INVALID_INSTRUCTION, "grow: expected the coordinator account");
  SolAccountInfo *a = &in->accounts[0];
  if (!equal(a->owner, in->program_id, 32) || a->data_len < 16 || ((State *)a->data)->magic != MAGIC) return fail(E_WRONG_ACCOUNT, "not a coordinator account of this program");
  if (!a->is_writable) return fail(E_NOT_WRITABLE, "the coordinator account must be writable");
  if (a->data_len >= sizeof(State)) return fail(E_INVALID_INSTRUCTION, "the coordinator account is already full size");
  u64 target = a->data_len + MAX_PERMITTED_DATA_INCREASE;
  if (target > sizeof(State)) target = sizeof(State);
  zero(a->data + a->data_len, target - a->data_len);
  *(u64 *)(a->data - 8) = target; /* the serialized length the runtime reads back */
  if (target == sizeof(State)) ((State *)a->data)->points_per_batch = POINTS_PER_BATCH; /* the last field init_coordinator could not reach */
  return 0;
}

/*
 * The peer directory: one account per client and run, the program address of ["peer", coordinator, client key],
 * holding the libp2p multiaddrs the client announced (newline-separated UTF-8). Only the client's own signature
 * writes it; its libp2p peer id is derived from the same ed25519 key, so a dialer checks whom it reached.
 */

/* accounts: client (signer, writable: pays the first time), coordinator, peer account (writable), system program.
 * data: lamports u64 (rent of a new peer account), addrs length u16, addrs */
static u64 set_peer(Input *in) {
  if (in->account_count < 4) return fail(E_INVALID_INSTRUCTION, "set_peer: expected client, coordinator, peer account, system program");
  SolAccountInfo *client = &in->accounts[0], *coord = &in->accounts[1], *peer = &in->accounts[2];
  if (!client->is_signer) return fail(E_MISSING_SIGNATURE, "the client must sign its peer record");
  if (!equal(coord->owner, in->program_id, 32) || coord->data_len != sizeof(State) || ((const State *)coord->data)->magic != MAGIC)
    return fail(E_WRONG_ACCOUNT, "not a coordinator account of this program");
  const u8 *d = in->data + 1;
  u64 len = in->data_len - 1;
  if (len < 10) return fail(E_INVALID_INSTRUCTION, "set_peer: expected lamports u64, length u16, addresses");
  u64 n = (u64)d[8] | ((u64)d[9] << 8);
  if (n > PEER_ADDRS_MAX) return fail(E_CAPACITY_EXCEEDED, "set_peer: the addresses exceed PEER_ADDRS_MAX (768 bytes)");
  if (len != 10 + n) return fail(E_INVALID_INSTRUCTION, "set_peer: bad data length");
  if (!peer->is_writable) return fail(E_NOT_WRITABLE, "the peer account must be writable");
  SolSignerSeed seeds[4] = {{(const u8 *)"peer", 4}, {coord->key, 32}, {client->key, 32}, {NULL, 1}};
  u8 address[32], bump;
  if (sol_try_find_program_address(seeds, 3, in->program_id, address, &bump)) return fail(E_WRONG_PROGRAM_ADDRESS, "no program address for this peer");
  if (!equal(address, peer->key, 32)) return fail(E_WRONG_PROGRAM_ADDRESS, "the peer account is not the program address of this run and client");
  if (!equal(peer->owner, in->program_id, 32)) {
    if (!client->is_writable) return fail(E_NOT_WRITABLE, "the client pays for its new peer record: it must be writable");
    seeds[3].addr = &bump;
    SolSignerSeeds signer = {seeds, 4};
    Create c = {client, peer, read_u64(d), sizeof(Peer), &signer};
    u64 e = create_account(in, &c);
    if (e) return e;
  } else if (peer->data_len != sizeof(Peer)) {
    return fail(E_WRONG_ACCOUNT, "the peer account is not a peer record of this program");
  }
  Peer *p = (Peer *)peer->data;
  p->magic = PEER_MAGIC;
  copy(p->coordinator, coord->key, 32);
  copy(p->client, client->key, 32);
  p->addrs_len = n;
  copy(p->addrs, d + 10, n);
  zero(p->addrs + n, PEER_ADDRS_MAX - n);
  return 0;
}


/*
 * A run's name and description (Psyche's create-run --name --description): one account per run, the program
 * address of ["metadata", coordinator], written by the run's main authority only. Not part of the coordinator's
 * state (no rule reads it).
 */

/* accounts: main authority (signer, writable: pays the first time), coordinator, metadata account (writable), system
 * program. data: lamports u64 (rent of a new account), name length u8, name, description length u16, description */
static u64 set_metadata(Input *in) {
  if (in->account_count < 4) return fail(E_INVALID_INSTRUCTION, "set_metadata: expected authority, coordinator, metadata account, system program");
  SolAccountInfo *auth = &in->accounts[0], *coord = &in->accounts[1], *meta = &in->accounts[2];
  if (!auth->is_signer) return fail(E_MISSING_SIGNATURE, "the main authority must sign");
  if (!equal(coord->owner, in->program_id, 32) || coord->data_len != sizeof(State) || ((const State *)coord->data)->magic != MAGIC)
    return fail(E_WRONG_ACCOUNT, "not a coordinator account of this program");
  if (!equal(((const State *)coord->data)->main_authority, auth->key, 32)) return fail(E_UNAUTHORIZED, "the signer is not the run's main authority");
  const u8 *d = in->data + 1;
  u64 len = in->data_len - 1;
  if (len < 9) return fail(E_INVALID_INSTRUCTION, "set_metadata: expected lamports, name, description");
  u64 name_len = d[8];
  if (name_len > NAME_MAX) return fail(E_CAPACITY_EXCEEDED, "set_metadata: the name exceeds NAME_MAX (64 bytes)");
  if (len < 9 + name_len + 2) return fail(E_INVALID_INSTRUCTION, "set_metadata: bad data length");
  u64 desc_len = read_u16(d + 9 + name_len);
  if (desc_len > DESCRIPTION_MAX) return fail(E_CAPACITY_EXCEEDED, "set_metadata: the description exceeds DESCRIPTION_MAX (512 bytes)");
  if (len != 9 + name_len + 2 + desc_len) return fail(E_INVALID_INSTRUCTION, "set_metadata: bad data length");
  if (!meta->is_writable) return fail(E_NOT_WRITABLE, "the metadata account must be writable");
  SolSignerSeed seeds[3] = {{(const u8 *)"metadata", 8}, {coord->key, 32}, {NULL, 1}};
  u8 address[32], bump;
  if (sol_try_find_program_address(seeds, 2, in->program_id, address, &bump)) return fail(E_WRONG_PROGRAM_ADDRESS, "no program address for this run's metadata");
  if (!equal(address, meta->key, 32)) return fail(E_WRONG_PROGRAM_ADDRESS, "the metadata account is not the program address of this run's metadata");
  if (!equal(meta->owner, in->program_id, 32)) {
    if (!auth->is_writable) return fail(E_NOT_WRITABLE, "the main authority pays for the new metadata record: it must be writable");
    seeds[2].addr = &bump;
    SolSignerSeeds signer = {seeds, 3};
    Create c = {auth, meta, read_u64(d), sizeof(Metadata), &signer};
    u64 e = create_account(in, &c);
    if (e) return e;
  } else if (meta->data_len != sizeof(Metadata)) {
    return fail(E_WRONG_ACCOUNT, "the metadata account is not a metadata record of this program");
  }
  Metadata *m = (Metadata *)meta->data;
  zero((u8 *)m, sizeof(Metadata));
  m->magic = METADATA_MAGIC;
  copy(m->coordinator, coord->key, 32);
  m->name_len = name_len;
  copy(m->name, d + 9, name_len);
  m->description_len = desc_len;
  copy(m->description, d + 9 + name_len + 2, desc_len);
  return 0;
}


/* accounts: client (signer, writable: receives the record's rent), coordinator, peer record (writable). The client
 * leaves the run's peer directory: its record is closed. */
static u64 close_peer(Input *in) {
  if (in->account_count < 3) return fail(E_INVALID_INSTRUCTION, "close_peer: expected client, coordinator, peer account");
  SolAccountInfo *client = &in->accounts[0], *coord = &in->accounts[1], *peer = &in->accounts[2];
  if (!client->is_signer) return fail(E_MISSING_SIGNATURE, "the client must sign");
  if (!client->is_writable || !peer->is_writable) return fail(E_NOT_WRITABLE, "the client and its peer record must be writable");
  if (!equal(coord->owner, in->program_id, 32) || coord->data_len != sizeof(State) || ((const State *)coord->data)->magic != MAGIC)
    return fail(E_WRONG_ACCOUNT, "not a coordinator account of this program");
  SolSignerSeed seeds[3] = {{(const u8 *)"peer", 4}, {coord->key, 32}, {client->key, 32}};
  u8 address[32], bump;
  if (sol_try_find_program_address(seeds, 3, in->program_id, address, &bump)) return fail(E_WRONG_PROGRAM_ADDRESS, "no program address for this peer");
  if (!equal(address, peer->key, 32)) return fail(E_WRONG_PROGRAM_ADDRESS, "the peer account is not the program address of this run and client");
  if (!equal(peer->owner, in->program_id, 32) || peer->data_len != sizeof(Peer)) return fail(E_WRONG_ACCOUNT, "no peer record to close");
  *client->lamports += *peer->lamports;
  *peer->lamports = 0;
  zero(peer->data, peer->data_len);
  return 0;
}

/*
 * The update buffer: an update too large for one transaction (its model JSON may be MODEL_JSON_MAX bytes) is written
 * to the run's buffer account, the program address of ["update", coordinator], in chunks appended in order
 * (buffer_write), then applied by update_from_buffer, which closes the buffer. Only the run's main authority writes it;
 * an incomplete buffer, or another run's, is refused.
 */
static u64 update_buffer(Input *in, u64 need_owned, u8 *bump) {
  SolAccountInfo *coord = &in->accounts[1], *buf = &in->accounts[2];
  SolSignerSeed seeds[2] = {{(const u8 *)"update", 6}, {coord->key, 32}};
  u8 address[32];
  if (sol_try_find_program_address(seeds, 2, in->program_id, address, bump)) return fail(E_WRONG_PROGRAM_ADDRESS, "no program address for this run's update buffer");
  if (!equal(address, buf->key, 32)) return fail(E_WRONG_PROGRAM_ADDRESS, "the buffer is not the program address of this run's update buffer");
  if (!buf->is_writable) return fail(E_NOT_WRITABLE, "the update buffer must be writable");
  if (!need_owned) return 0;
  const UpdateBuffer *b = (const UpdateBuffer *)buf->data;
  if (!equal(buf->owner, in->program_id, 32) || buf->data_len != sizeof(UpdateBuffer) || b->magic != BUFFER_MAGIC || !equal(b->coordinator, coord->key, 32))
    return fail(E_WRONG_ACCOUNT, "no update buffer for this run: send buffer_init first");
  return 0;
}

/* accounts: main authority (signer, writable: pays a new buffer), coordinator, buffer (writable), system program.
 * data: lamports u64 (rent of a new buffer), length u16 (of the update's data). Creates the buffer, or empties it. */
static u64 buffer_init(Input *in, const u8 *d, u64 len) {
  if (in->account_count < 4) return fail(E_INVALID_INSTRUCTION, "buffer_init: expected authority, coordinator, buffer, system program");
  if (len != 10) return fail(E_INVALID_INSTRUCTION, "buffer_init: expected lamports u64 and length u16");
  SolAccountInfo *auth = &in->accounts[0], *coord = &in->accounts[1], *buf = &in->accounts[2];
  u64 n = read_u16(d + 8);
  if (n < 2 + sizeof(Config) || n > UPDATE_MAX) return fail(E_CAPACITY_EXCEEDED, "buffer_init: an update is 130 to UPDATE_MAX = " STR(UPDATE_MAX) " bytes");
  u8 bump;
  u64 e = update_buffer(in, 0, &bump);
  if (e) return e;
  if (!equal(buf->owner, in->program_id, 32)) {
    if (!auth->is_writable) return fail(E_NOT_WRITABLE, "the main authority pays for the update buffer: it must be writable");
    SolSignerSeed seeds[3] = {{(const u8 *)"update", 6}, {coord->key, 32}, {&bump, 1}};
    SolSignerSeeds signer = {seeds, 3};
    Create c = {auth, buf, read_u64(d), sizeof(UpdateBuffer), &signer};
    if ((e = create_account(in, &c))) return e;
  } else if (buf->data_len != sizeof(UpdateBuffer)) {
    return fail(E_WRONG_ACCOUNT, "the buffer account is not an update buffer of this program");
  }
  UpdateBuffer *b = (UpdateBuffer *)buf->data;
  zero(b, sizeof(UpdateBuffer));
  b->magic = BUFFER_MAGIC;
  copy(b->coordinator, coord->key, 32);
  copy(b->authority, auth->key, 32);
  b->len = n;
  return 0;
}

/* accounts: main authority (signer), coordinator, buffer (writable). data: offset u16, the chunk. */
static u64 buffer_write(Input *in, const u8 *d, u64 len) {
  if (in->account_count < 3) return fail(E_INVALID_INSTRUCTION, "buffer_write: expected authority, coordinator, buffer");
  if (len < 3) return fail(E_INVALID_INSTRUCTION, "buffer_write: expected offset u16 and bytes");
  u8 bump;
  u64 e = update_buffer(in, 1, &bump);
  if (e) return e;
  UpdateBuffer *b = (UpdateBuffer *)in->accounts[2].data;
  u64 offset = read_u16(d), n = len - 2;
  if (offset != b->written) return fail(E_INVALID_INSTRUCTION, "buffer_write: chunks are appended in order (the offset must be the bytes written so far)");
  if (b->written + n > b->len) return fail(E_CAPACITY_EXCEEDED, "buffer_write: past the length buffer_init set");
  copy(b->data + offset, d + 2, n);
  b->written += n;
  return 0;
}

/* accounts: main authority (signer, writable: gets the buffer's rent back), coordinator, buffer (writable). Applies the
 * buffered update as `update` would, then closes the buffer. */
static u64 update_from_buffer(Input *in, State *s, u64 len) {
  if (in->account_count < 3) return fail(E_INVALID_INSTRUCTION, "update_from_buffer: expected authority, coordinator, buffer");
  if (len) return fail(E_INVALID_INSTRUCTION, "update_from_buffer takes no data");
  u8 bump;
  u64 e = update_buffer(in, 1, &bump);
  if (e) return e;
  SolAccountInfo *auth = &in->accounts[0], *buf = &in->accounts[2];
  if (!auth->is_writable) return fail(E_NOT_WRITABLE, "the main authority gets the buffer's rent back: it must be writable");
  const UpdateBuffer *b = (const UpdateBuffer *)buf->data;
  if (b->written != b->len) return fail(E_INVALID_INSTRUCTION, "the update buffer is incomplete: write every chunk first");
  if ((e = on_update(s, b->data, b->len))) return e;
  *auth->lamports += *buf->lamports;
  *buf->lamports = 0;
  zero(buf->data, buf->data_len);
  return 0;
}

static u64 load(Input *in, u64 index, State **out) {
  if (in->account_count <= index) return fail(E_INVALID_INSTRUCTION, "missing the coordinator account");
  SolAccountInfo *a = &in->accounts[index];
  if (!equal(a->owner, in->program_id, 32) || a->data_len != sizeof(State)) return fail(E_WRONG_ACCOUNT, "not a coordinator account of this program");
  State *s = (State *)a->data;
  if (s->magic != MAGIC || s->version != LAYOUT_VERSION) return fail(E_WRONG_ACCOUNT, "not a coordinator account of this program");
  if (!a->is_writable) return fail(E_NOT_WRITABLE, "the coordinator account must be writable");
  *out = s;
  return 0;
}

/* Authorization (programs/authorizer) of a permissioned join: accounts[2], owned by the run's authorizer
 * program, granted by the join authority, active, to this key, to anyone, or to a grantee that made this key
 * its delegate. */

static u64 authorized(Input *in, const State *s, const u8 *key) {
  if (in->account_count < 3) return fail(E_NOT_PERMITTED, "this run is permissioned: pass an authorization from its join authority");
  const SolAccountInfo *acc = &in->accounts[2];
  const Authorization *a = (const Authorization *)acc->data;
  if (!equal(acc->owner, s->authorizer, 32) || acc->data_len != sizeof(Authorization) || a->magic != AUTH_MAGIC)
    return fail(E_NOT_PERMITTED, "the authorization is not an account of the run's authorizer program");
  if (!a->active || !equal(a->grantor, s->join_authority, 32)) return fail(E_NOT_PERMITTED, "the authorization is not granted by the run's join authority");
  u8 none[32];
  zero(none, 32);
  if (equal(a->grantee, key, 32) || equal(a->grantee, none, 32)) return 0;
  for (u64 i = 0; i < a->delegates_len && i < 16; i++)
    if (equal(a->delegates[i], key, 32)) return 0;
  return fail(E_NOT_PERMITTED, "the authorization names neither this key nor it as a delegate");
}

/* accounts[0] must have signed; with `authority`, it must also be that key. */
static u64 signer(Input *in, const u8 *authority) {
  if (in->account_count < 1 || !in->accounts[0].is_signer) return fail(E_MISSING_SIGNATURE, "the first account must sign");
  if (authority && !equal(in->accounts[0].key, authority, 32)) return fail(E_UNAUTHORIZED, "the signer is not the run's authority for this instruction");
  return 0;
}

u64 entrypoint(const u8 *input) {
  Input in;
  if (deserialize(input, &in)) return fail(E_INVALID_INSTRUCTION, "too many accounts");
  if (in.data_len < 1) return fail(E_INVALID_INSTRUCTION, "empty instruction");
  u8 tag = in.data[0];
  const u8 *d = in.data + 1;
  u64 len = in.data_len - 1;
  if (tag == IX_INIT_COORDINATOR) return init_coordinator(&in);
  if (tag == IX_GROW) return grow(&in);
  if (tag == IX_SET_PEER) return set_peer(&in);
  if (tag == IX_SET_METADATA) return set_metadata(&in);
  if (tag == IX_CLOSE_PEER) return close_peer(&in);
  State *s;
  u64 e;
  if (tag == IX_TICK) {
    /* accounts: coordinator (anyone may tick; the fee payer signs the transaction) */
    if ((e = load(&in, 0, &s))) return e;
    if (len) return fail(E_INVALID_INSTRUCTION, "tick takes no data");
    return on_tick(s, now_ms());
  }
  /* every other instruction: accounts[0] signs, accounts[1] is the coordinator */
  if ((e = load(&in, 1, &s))) return e;
  const u8 *key = in.accounts[0].key;
  switch (tag) {
    case IX_UPDATE:
      if ((e = signer(&in, s->main_authority))) return e;
      return on_update(s, d, len);
    case IX_BUFFER_INIT:
      if ((e = signer(&in, s->main_authority))) return e;
      return buffer_init(&in, d, len);
    case IX_BUFFER_WRITE:
      if ((e = signer(&in, s->main_authority))) return e;
      return buffer_write(&in, d, len);
    case IX_UPDATE_FROM_BUFFER:
      if ((e = signer(&in, s->main_authority))) return e;
      return update_from_buffer(&in, s, len);
    case IX_SET_RATES:
      /* data: points per batch u64, token rate u64: the rates the next epoch starts with (set_future_epoch_rates) */
      if ((e = signer(&in, s->main_authority))) return e;
      if (len != 16) return fail(E_INVALID_INSTRUCTION, "set_rates: expected points per batch and token rate (u64 each)");
      if (read_u64(d) > MAX_POINTS_PER_BATCH) return fail(E_INVALID_CONFIG, "set_rates: points per batch above MAX_POINTS_PER_BATCH = " STR(MAX_POINTS_PER_BATCH));
      if (read_u64(d + 8) > MAX_TOKEN_RATE) return fail(E_INVALID_CONFIG, "set_rates: token rate above MAX_TOKEN_RATE = " STR(MAX_TOKEN_RATE));
      s->next_points_per_batch = read_u64(d);
      s->next_token_rate = read_u64(d + 8);
      s->has_next_rates = 1;
      return 0;
    case IX_SET_PAUSED:
      if ((e = signer(&in, s->main_authority))) return e;
      if (len != 1 || d[0] > 1) return fail(E_INVALID_INSTRUCTION, "set_paused: expected 1 (pause) or 0 (resume)");
      return d[0] ? on_pause(s, now_ms()) : on_resume(s, now_ms());
    case IX_JOIN_RUN: {
      if ((e = signer(&in, NULL))) return e;
      u8 none[32];
      zero(none, 32);
      if (!equal(s->join_authority, none, 32) && !equal(s->join_authority, key, 32) && (e = authorized(&in, s, key))) return e;
      if (len) return fail(E_INVALID_INSTRUCTION, "join_run takes no data");
      return on_join(s, key);
    }
    case IX_WITNESS:
      if ((e = signer(&in, NULL))) return e;
      return on_witness(s, now_ms(), key, d, len);
    case IX_WARMUP_WITNESS:
      if ((e = signer(&in, NULL))) return e;
      if (s->run_state == ROUND_TRAIN || s->run_state == ROUND_WITNESS) return fail(E_INVALID_RUN_STATE, "warmup_witness is accepted in Warmup only; send witness proofs in rounds");
      if (len) return fail(E_INVALID_INSTRUCTION, "warmup_witness takes no data");
      return on_witness(s, now_ms(), key, d, len);
    case IX_HEALTH_CHECK:
      if ((e = signer(&in, NULL))) return e;
      return on_health_check(s, key, d, len);
    case IX_CHECKPOINT:
      if ((e = signer(&in, NULL))) return e;
      return on_checkpoint(s, key, d, len);
    case IX_HASH_WITNESS:
      if ((e = signer(&in, NULL))) return e;
      return on_hash_witness(s, key, d, len);
    case IX_ACCUSE:
      if ((e = signer(&in, NULL))) return e;
      return on_accuse(s, key, d, len);
    case IX_REPORT_SCORES:
      if ((e = signer(&in, NULL))) return e;
      return on_report_scores(s, key, d, len);
    case IX_EQUIVOCATION:
      if ((e = signer(&in, NULL))) return e;
      return on_equivocation(&in, s, key, d, len);
    case IX_WITHDRAW:
      if ((e = signer(&in, NULL))) return e;
      if (len) return fail(E_INVALID_INSTRUCTION, "withdraw takes no data");
      return on_withdraw(s, key, 0);
    case IX_EJECT:
      if ((e = signer(&in, s->main_authority))) return e;
      if (len != 32) return fail(E_INVALID_INSTRUCTION, "eject: expected the client's public key");
      return on_withdraw(s, d, 1);
    case IX_FREE_COORDINATOR: {
      /* accounts: main authority (signer), coordinator, recipient of its lamports */
      if ((e = signer(&in, s->main_authority))) return e;
      if (in.account_count < 3 || !in.accounts[2].is_writable) return fail(E_INVALID_INSTRUCTION, "free_coordinator: expected a writable recipient");
      if (!HALTED(s->run_state)) return fail(E_INVALID_RUN_STATE, "pause the run (or let it finish) before freeing its coordinator");
      SolAccountInfo *coord = &in.accounts[1], *to = &in.accounts[2];
      *to->lamports += *coord->lamports;
      *coord->lamports = 0;
      zero(coord->data, coord->data_len);
      return 0;
    }
    default:
      return fail(E_INVALID_INSTRUCTION, "unknown instruction");
  }
}
