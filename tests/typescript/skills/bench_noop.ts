// The hop bench's no-op hooks (tests.bench.skills:HopNoop) for the TypeScript worker: the
// same two lifecycles, returning undefined ("unchanged"), at priority 20 so that the
// bench's plan puts this group's segment after the Python group's.
import { Skill, hook } from 'hookbus';

export class HopNoopTs extends Skill {
  readonly name = 'hop-noop-ts';

  @hook({ lifecycle: 'on_chunk', priority: 20 })
  async chunk() {
    return undefined;
  }

  @hook({ lifecycle: 'before_llm_call', priority: 20 })
  async before() {
    return undefined;
  }
}
