/**
 * What a hook or a tool is on the wire: the descriptors a worker group announces in the
 * registry, field for field the Python models (hookbus.skills.descriptors), so the
 * orchestrator plans TypeScript hooks exactly like Python ones.
 */

export interface HookDescriptor {
  skill: string;
  method: string;
  lifecycle: string;
  priority: number;
  scope: string;
  timeout: number | null;
  critical: boolean;
  guard: boolean;
}

export interface ToolDescriptor {
  skill: string;
  name: string;
  /** The OpenAI function tool: `{type: 'function', function: {name, description, parameters}}`. */
  parameters_schema: Record<string, unknown>;
  scope: string;
  timeout: number | null;
}
