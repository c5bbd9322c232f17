// The shape a chart dashboard must have: Grafana's own published types, made exact.
//
// check_dashboards.py (beside this file) writes each dashboard JSON as
// `const dashboard: CheckedDashboard = <the JSON>` and runs `tsc --noEmit --strict`. An object
// literal may only name keys its type declares, so a misspelt or made-up key is an error at every
// depth, as is a value of the wrong type or outside an enum, or a missing required key.
//
// @grafana/schema types the dashboard model (Dashboard, Panel, RowPanel, VariableModel) and each
// core panel plugin's options and field config (the composable panelcfg types), but leaves a
// panel's `options`, `fieldConfig.defaults.custom` and `targets` open (Record<string, unknown>),
// since they depend on the panel and datasource plugin. CheckedDashboard closes them: each panel
// type gets its plugin's Options and FieldConfig, and every target is a Prometheus query, typed by
// Grafana's Foundation SDK (generated from the Prometheus plugin's own schema, which
// @grafana/schema no longer ships). A panel type missing from PanelKinds is an error: add its
// panelcfg types below before using it.
import type {
  Dashboard,
  FieldConfig,
  FieldConfigSource,
  Panel,
  RowPanel,
} from '@grafana/schema';
import type * as barchart from '@grafana/schema/dist/esm/raw/composable/barchart/panelcfg/x/BarChartPanelCfg_types.gen';
import type * as bargauge from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen';
import type * as gauge from '@grafana/schema/dist/esm/raw/composable/gauge/panelcfg/x/GaugePanelCfg_types.gen';
import type * as heatmap from '@grafana/schema/dist/esm/raw/composable/heatmap/panelcfg/x/HeatmapPanelCfg_types.gen';
import type * as histogram from '@grafana/schema/dist/esm/raw/composable/histogram/panelcfg/x/HistogramPanelCfg_types.gen';
import type * as piechart from '@grafana/schema/dist/esm/raw/composable/piechart/panelcfg/x/PieChartPanelCfg_types.gen';
import type * as stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type * as statetimeline from '@grafana/schema/dist/esm/raw/composable/statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen';
import type * as table from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';
import type * as text from '@grafana/schema/dist/esm/raw/composable/text/panelcfg/x/TextPanelCfg_types.gen';
import type * as timeseries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';
import type * as prometheus from '@grafana/grafana-foundation-sdk/prometheus';

/**
 * A type as JSON spells it. TypeScript's string enums are nominal (the string "list" is not a
 * LegendDisplayMode), JSON has only their values: a string enum becomes the union of its values.
 * Numeric enums already accept their numbers and nothing else.
 */
export type Json<T> = 0 extends 1 & T
  ? T // any stays any
  : T extends string
    ? `${T}`
    : T extends number | boolean | null | undefined
      ? T
      : T extends (...args: never[]) => unknown
        ? never
        : T extends ReadonlyArray<infer U>
          ? Array<Json<U>>
          : { [K in keyof T]: Json<T[K]> };

/** A Prometheus panel query. (The SDK's marker method is no part of the JSON.) */
export type PrometheusQuery = Omit<prometheus.Dataquery, '_implementsDataqueryVariant'>;

/** No field-config `custom` options: the plugin declares none. */
type NoCustom = Record<string, never>;

/** Each core panel plugin this project may use: its options and its field config's `custom`. */
interface PanelKinds {
  barchart: { options: barchart.Options; custom: barchart.FieldConfig };
  bargauge: { options: bargauge.Options; custom: NoCustom };
  gauge: { options: gauge.Options; custom: NoCustom };
  heatmap: { options: heatmap.Options; custom: heatmap.FieldConfig };
  histogram: { options: histogram.Options; custom: histogram.FieldConfig };
  piechart: { options: piechart.Options; custom: piechart.FieldConfig };
  stat: { options: stat.Options; custom: NoCustom };
  'state-timeline': { options: statetimeline.Options; custom: statetimeline.FieldConfig };
  table: { options: table.Options; custom: table.FieldConfig };
  text: { options: text.Options; custom: NoCustom };
  timeseries: { options: timeseries.Options; custom: timeseries.FieldConfig };
}

type PanelOf<K extends keyof PanelKinds> = Omit<
  Panel,
  'type' | 'options' | 'fieldConfig' | 'targets'
> & {
  type: K;
  options?: PanelKinds[K]['options'];
  fieldConfig?: Omit<FieldConfigSource, 'defaults'> & {
    defaults: Omit<FieldConfig, 'custom'> & { custom?: PanelKinds[K]['custom'] };
  };
  targets?: PrometheusQuery[];
};

/** One of the known panel kinds, told apart by `type`. */
export type AnyPanel = { [K in keyof PanelKinds]: PanelOf<K> }[keyof PanelKinds];

export type CheckedRow = Omit<RowPanel, 'panels'> & { panels: AnyPanel[] };

export type CheckedDashboard = Json<
  Omit<Dashboard, 'panels'> & { panels?: Array<AnyPanel | CheckedRow> }
>;
