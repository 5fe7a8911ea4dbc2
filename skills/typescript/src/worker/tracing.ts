/**
 * OpenTelemetry in the TypeScript worker, as in the Python one
 * (hookbus.services.observability.tracing): off unless the standard variables ask for it,
 * `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (OTLP over HTTP,
 * protobuf) or `OTEL_TRACES_EXPORTER=otlp|console`; `OTEL_SDK_DISABLED=true` or
 * `OTEL_TRACES_EXPORTER=none` turn it off. `OTEL_SERVICE_NAME` (default `hookbus-worker`),
 * `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_BSP_*` are the SDK's own reading.
 *
 * On, a hop that carries the orchestrator's trace context (the envelope's `trace`, W3C
 * `traceparent`) gets a `process {group}` span continuing it, with a `hook {key}` span per
 * hook below it, so a request's one trace has no hole where a TypeScript group ran. A hop
 * without a trace context gets no span: a worker continues traces, it never starts one.
 */

import { context, defaultTextMapGetter, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Span, type Tracer } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { detectResources, envDetector, resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, BatchSpanProcessor, ConsoleSpanExporter, type SpanExporter } from '@opentelemetry/sdk-trace-base';
import { log } from '../log.js';
import type { HookObserver } from '../runner.js';


let provider: BasicTracerProvider | undefined;
let tracer: Tracer | undefined;
const propagator = new W3CTraceContextPropagator();

function flag(name: string, env: NodeJS.ProcessEnv): boolean {
  return ['1', 'true', 'yes', 'on'].includes((env[name] ?? '').trim().toLowerCase());
}

/** The exporter the environment asks for, or undefined (tracing off). */
function exporter(env: NodeJS.ProcessEnv): SpanExporter | undefined {
  const named = (env.OTEL_TRACES_EXPORTER ?? '').trim().toLowerCase();
  const endpoint = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT || env.OTEL_EXPORTER_OTLP_ENDPOINT;
  if (flag('OTEL_SDK_DISABLED', env) || named === 'none' || !(named || endpoint)) return undefined;
  if (named === 'console') return new ConsoleSpanExporter();
  return new OTLPTraceExporter();
}

/** Set tracing up for this replica when the environment asks for it; whether it is on. */
export function configureTracing(replica: string, env: NodeJS.ProcessEnv = process.env): boolean {
  const chosen = exporter(env);
  if (!chosen) return false;
  const resource = detectResources({ detectors: [envDetector] }).merge(resourceFromAttributes({
    'service.name': env.OTEL_SERVICE_NAME || 'hookbus-worker',
    'service.instance.id': replica,
    'telemetry.sdk.language': 'nodejs',
  }));
  const delay = Number(env.OTEL_BSP_SCHEDULE_DELAY);
  const processor = new BatchSpanProcessor(chosen, delay > 0 ? { scheduledDelayMillis: delay } : {});
  provider = new BasicTracerProvider({ resource, spanProcessors: [processor] });
  tracer = provider.getTracer('hookbus');
  log('tracing_on', { replica, exporter: chosen.constructor.name }, 'info');
  return true;
}

/** Flush what is buffered and stop (the replica stops). */
export async function shutdownTracing(): Promise<void> {
  const stopping = provider;
  provider = tracer = undefined;
  await stopping?.shutdown().catch((exc: Error) => log('tracing_shutdown_failed', { error: exc.message }));
}

function failed(span: Span, error: string): void {
  span.setStatus({ code: SpanStatusCode.ERROR, message: error });
  span.setAttribute('error.type', error.split(':', 1)[0] || 'error');
}

/** One hop's span and the observer of its hooks' calls. */
export interface ProcessSpan {
  observe: HookObserver;
  end(error?: string): void;
}

/** `process {group}` continuing the hop's trace context; undefined while off or when the
 * hop carries none. */
export function processSpan(
  group: string, replica: string, lifecycle: string, carrier: Record<string, unknown> | null | undefined, attempt: number, version: string,
): ProcessSpan | undefined {
  if (!tracer || !carrier || typeof carrier.traceparent !== 'string') return undefined;
  const active = tracer;
  const parent = propagator.extract(ROOT_CONTEXT, carrier, defaultTextMapGetter);
  const span = active.startSpan(`process ${group}`, {
    kind: SpanKind.CONSUMER,
    attributes: {
      'hookbus.group': group, 'hookbus.replica': replica, 'hookbus.worker.version': version, 'hookbus.lifecycle': lifecycle,
      'hookbus.attempt': attempt, 'messaging.system': 'redis', 'messaging.operation.type': 'process',
    },
  }, parent);
  const below = trace.setSpan(context.active(), span);
  return {
    observe: (key, hookLifecycle) => {
      const hook = active.startSpan(`hook ${key}`, { attributes: { 'hookbus.hook': key, 'hookbus.lifecycle': hookLifecycle } }, below);
      return {
        end: (error) => {
          if (error !== undefined) failed(hook, error);
          hook.end();
        },
      };
    },
    end: (error) => {
      if (error !== undefined) failed(span, error);
      span.end();
    },
  };
}
