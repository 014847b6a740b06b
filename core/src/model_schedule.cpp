// The block schedule: every parameter declared and every call of the forward pass written down
// once (model_schedule.hpp).
#include "model_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

namespace ablate::schedule {

LayerSpecs make_specs(const ModelOptions& o, PositionSite position) {
  const double resid_std = 0.02 / std::sqrt(2.0 * double(o.n_layers));
  const int64_t C = o.d_model, D = o.head_dim;
  LayerSpecs s;
  s.emb.in = C;
  s.emb.out = o.vocab_padded;
  s.pos.in = position == PositionSite::qk ? D : C;
  s.pos.max_positions = o.max_seq_len;
  s.norm.in = C;
  s.norm.bias = o.bias;
  s.norm.eps = o.norm_epsilon();
  s.q.in = C;
  s.q.out = o.n_heads * D;
  s.q.bias = o.bias;
  s.kv = s.q;
  s.kv.out = o.n_kv_heads * D;
  s.o = s.q;
  s.o.in = o.n_heads * D;
  s.o.out = C;
  s.o.init_std = resid_std;
  s.mlp.in = C;
  s.mlp.out = o.mlp_hidden;
  s.mlp.bias = o.bias;
  s.qkn.in = D;
  s.qkn.bias = false;
  s.qkn.eps = o.qk_norm_epsilon();
  s.cls.in = C;
  s.cls.out = o.vocab_padded;
  s.cls.real_out = o.vocab_size;
  s.cls.declare = !o.tie_embeddings;
  return s;
}

namespace {

Site layer_site(Layer* layer, const LayerSpec* spec, int64_t param, int64_t x_cols, int64_t y_cols) {
  Site s;
  s.layer = layer;
  s.spec = spec;
  s.param = param;
  s.x_cols = x_cols;
  s.y_cols = y_cols;
  return s;
}

Site norm_site(Layer* layer, const LayerSpec* spec, int64_t param, Ref x, Ref y, Ref saved, Ref d_y, Ref d_x, GradMode mode,
               int64_t width, int64_t row_heads = 1) {
  Site s = layer_site(layer, spec, param, width, width);
  s.x = x;
  s.y = y;
  s.saved = saved;
  s.d_y = d_y;
  s.d_x = d_x;
  s.input_grad = mode;
  s.row_heads = row_heads;
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Writes the sites of one block; `dropout_site` numbers the dropouts of the whole pass.
struct BlockWriter {
  const ModelOptions& o;
  const ModelLayers& L;
  const LayerSpecs& specs;
  ParamTable& table;
  Schedule& out;
  uint64_t& dropout_site;

  int64_t declare(const LayerBase& layer, const LayerSpec& spec, const std::string& prefix) {
    const int64_t before = table.total;
    layer.declare_params(spec, prefix, table);
    return before;
  }

  void attention_half(int64_t l, const std::string& pre) {
    const int64_t C = o.d_model, D = o.head_dim, H = o.n_heads, Hk = o.n_kv_heads;
    auto B = [l](Slot s) { return in_block(l, s); };
    const Ref d_res = shared(Slot::d_res), d_ln = shared(Slot::d_ln);
    std::vector<Site>& sites = out.sites;
    sites.push_back(norm_site(L.norm, &specs.norm, declare(*L.norm, specs.norm, pre + ".ln1"), B(Slot::res), B(Slot::ln1),
                              B(Slot::ln1_s), d_ln, d_res, GradMode::accumulate, C));
    // q, k, v read ln1; backward visits v first, which writes d_ln, then k and q add to it.
    const struct {
      const char* name;
      const char* target;
      const LayerSpec* spec;
      Slot out, d_out;
      int64_t width;
    } proj[] = {{".attn.q", "q", &specs.q, Slot::q_lin, Slot::d_qlin, H * D},
                {".attn.k", "k", &specs.kv, Slot::k_lin, Slot::d_klin, Hk * D},
                {".attn.v", "v", &specs.kv, Slot::v, Slot::d_v, Hk * D}};
    for (const auto& pr : proj) {
      Site s = layer_site(L.lin, pr.spec, declare(*L.lin, *pr.spec, pre + pr.name), C, pr.width);
      s.target = pr.target;
      s.block = int32_t(l);
      s.x = B(Slot::ln1);
      s.y = B(pr.out);
      s.d_y = shared(pr.d_out);
      s.d_x = d_ln;
      s.input_grad = pr.out == Slot::v ? GradMode::overwrite : GradMode::accumulate;
      sites.push_back(s);
    }
    if (o.qk_norm) {
      sites.push_back(norm_site(L.qkn, &specs.qkn, declare(*L.qkn, specs.qkn, pre + ".attn.q_norm"), B(Slot::q_lin), B(Slot::q),
                                B(Slot::qn_s), shared(Slot::d_q), shared(Slot::d_qlin), GradMode::overwrite, D, H));
      sites.push_back(norm_site(L.qkn, &specs.qkn, declare(*L.qkn, specs.qkn, pre + ".attn.k_norm"), B(Slot::k_lin), B(Slot::k),
                                B(Slot::kn_s), shared(Slot::d_k), shared(Slot::d_klin), GradMode::overwrite, D, Hk));
    }
    if (L.pos->position_site() == PositionSite::qk) {  // in place, forward on q and k, backward on their gradients
      for (auto [slot, d_slot, heads] : {std::tuple{Slot::q, Slot::d_q, H}, {Slot::k, Slot::d_k, Hk}}) {
        Site r = layer_site(L.pos, &specs.pos, -1, heads * D, heads * D);
        r.heads = heads;
        r.x = r.y = B(slot);
        r.d_y = r.d_x = shared(d_slot);
        sites.push_back(r);
      }
    }
    Site a;
    a.op = Op::attention;
    a.attn = {B(Slot::q),          B(Slot::k),        B(Slot::v),        B(Slot::att),     B(Slot::att_s),
              shared(Slot::d_att), shared(Slot::d_q), shared(Slot::d_k), shared(Slot::d_v)};
    sites.push_back(a);
    Site proj_out = layer_site(L.lin, &specs.o, declare(*L.lin, specs.o, pre + ".attn.o"), H * D, C);
    proj_out.target = "o";
    proj_out.block = int32_t(l);
    proj_out.x = B(Slot::att);
    proj_out.y = B(Slot::mid);
    proj_out.residual = B(Slot::res);
    proj_out.d_y = d_res;
    proj_out.d_x = shared(Slot::d_att);
    proj_out.dropout_site = ++dropout_site;
    sites.push_back(proj_out);
  }

  void mlp_half(int64_t l, const std::string& pre) {
    const int64_t C = o.d_model;
    const double resid_std = 0.02 / std::sqrt(2.0 * double(o.n_layers));
    auto B = [l](Slot s) { return in_block(l, s); };
    out.sites.push_back(norm_site(L.norm, &specs.norm, declare(*L.norm, specs.norm, pre + ".ln2"), B(Slot::mid), B(Slot::ln2),
                                  B(Slot::ln2_s), shared(Slot::d_ln), shared(Slot::d_res), GradMode::accumulate, C));
    const std::size_t first_mlp = table.slices.size();
    Site m = layer_site(L.mlp, &specs.mlp, declare(*L.mlp, specs.mlp, pre + ".mlp"), C, C);
    for (std::size_t i = first_mlp; i < table.slices.size(); ++i) {  // residual output projections
      ParamSlice& s = table.slices[i];
      if ((ends_with(s.name, ".proj.weight") || ends_with(s.name, ".down.weight")) && s.init_std > 0) s.init_std = resid_std;
    }
    m.x = B(Slot::ln2);
    m.y = in_block(l + 1, Slot::res);
    m.residual = B(Slot::mid);
    m.saved = B(Slot::mlp_s);
    m.d_y = shared(Slot::d_res);
    m.d_x = shared(Slot::d_ln);
    m.dropout_site = ++dropout_site;
    out.sites.push_back(m);
  }
};

// The gradient writes of one backward pass in their order: the classifier's (with the loss, in
// the forward pass), then each site with parameters in reverse. Declarations are contiguous and
// in order, so a site's parameters run up to the next declared offset.
std::vector<GradRange> gradient_writes(const std::vector<Site>& sites, int64_t head, int64_t total) {
  std::vector<int64_t> starts;
  for (const Site& s : sites) {
    if (s.param >= 0) starts.push_back(s.param);
  }
  starts.push_back(head);
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  const auto range_of = [&](int64_t begin) {
    const auto next = std::upper_bound(starts.begin(), starts.end(), begin);
    return GradRange{begin, next == starts.end() ? total : *next};
  };
  std::vector<GradRange> writes{range_of(head)};
  for (auto it = sites.rbegin(); it != sites.rend(); ++it) {
    if (it->param >= 0) writes.push_back(range_of(it->param));
  }
  return writes;
}

// The adapters, after every base parameter: one on each projection o.adapter_targets names. Only
// they train, so the gradient writes are theirs (in backward order), relative to the first.
void declare_adapters(const ModelOptions& o, Layer& adapter, BlockWriter& w, Schedule& out, ParamTable& table) {
  out.adapter_begin = table.total;
  std::vector<int64_t> starts;
  for (Site& s : out.sites) {
    if (s.target == nullptr || std::find(o.adapter_targets.begin(), o.adapter_targets.end(), s.target) == o.adapter_targets.end())
      continue;
    s.adapter_param = w.declare(adapter, *s.spec, "blocks." + std::to_string(s.block) + ".attn." + s.target);
    s.adapter_index = out.adapter_sites++;
    starts.push_back(s.adapter_param);
  }
  starts.push_back(table.total);
  for (int32_t i = out.adapter_sites; i-- > 0;) {
    out.writes.push_back({starts[std::size_t(i)] - out.adapter_begin, starts[std::size_t(i) + 1] - out.adapter_begin});
  }
}

}  // namespace

Schedule build_schedule(const ModelOptions& o, const ModelLayers& L, const LayerSpecs& specs, ParamTable& table) {
  Schedule out;
  uint64_t dropout_site = 0;
  BlockWriter w{o, L, specs, table, out, dropout_site};
  const int64_t C = o.d_model;
  const Ref x0 = in_block(0, Slot::res);

  Site e = layer_site(L.emb, &specs.emb, w.declare(*L.emb, specs.emb, "wte"), 0, C);
  e.y = x0;
  e.d_y = shared(Slot::d_res);
  e.dropout_site = ++dropout_site;
  out.sites.push_back(e);
  if (L.pos->position_site() == PositionSite::stream) {
    Site p = layer_site(L.pos, &specs.pos, w.declare(*L.pos, specs.pos, "wpe"), C, C);
    p.x = p.y = x0;
    p.d_y = p.d_x = shared(Slot::d_res);
    out.sites.push_back(p);
  }
  for (int64_t l = 0; l < o.n_layers; ++l) {
    const std::string pre = "blocks." + std::to_string(l);
    out.block_sites.push_back({out.sites.size(), 0});
    w.attention_half(l, pre);
    w.mlp_half(l, pre);
    out.block_sites.back().second = out.sites.size() - 1;  // the MLP: the block's last site
  }
  out.ln_f_param = w.declare(*L.norm, specs.norm, "ln_f");
  out.sites.push_back(norm_site(L.norm, &specs.norm, out.ln_f_param, in_block(o.n_layers, Slot::res), shared(Slot::lnf),
                                shared(Slot::lnf_s), shared(Slot::d_ln), shared(Slot::d_res), GradMode::overwrite, C));
  out.head = o.tie_embeddings ? out.sites.front().param : w.declare(*L.cls, specs.cls, "lm_head");
  if (L.adapter == nullptr) {
    out.writes = gradient_writes(out.sites, out.head, table.total);
    return out;
  }
  declare_adapters(o, *L.adapter, w, out, table);
  return out;
}

}  // namespace ablate::schedule
